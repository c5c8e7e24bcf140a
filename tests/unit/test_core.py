import pytest

from services.core.errors import ClusterMedicError, ConfigError, PluginError
from services.core.registry import Registry
from services.core.settings import Settings


def test_settings_read_the_prefixed_environment(monkeypatch):
    monkeypatch.setenv("CLUSTERMEDIC_KAFKA_PORT", "29092")
    monkeypatch.setenv("CLUSTERMEDIC_TOPIC_PREFIX", "x.")
    settings = Settings()
    assert settings.bootstrap_servers == "127.0.0.1:29092"
    assert settings.topic("anomalies.v1") == "x.anomalies.v1"


def test_explicit_urls_win_over_local_defaults():
    settings = Settings(kafka_bootstrap="k1:9092,k2:9092", redis_url="redis://r:6379/1")
    assert settings.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.broker_url == "redis://r:6379/1"


def test_every_setting_is_documented():
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description"


def test_registry_loads_lazily_and_checks_the_base():
    registry: Registry[type] = Registry("error", {"config": "services.core.errors:ConfigError"}, base=ClusterMedicError)
    assert registry.names() == ["config"]
    assert registry.load("config") is ConfigError


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"x": "services.core.nothere:X"}, "cannot import"),
        ({"x": "services.core.errors:Missing"}, "no attribute"),
        ({"x": "services.core.errors"}, "module:Attribute"),
        ({"x": "services.core.settings:Settings"}, "is not a ClusterMedicError"),
    ],
)
def test_registry_errors_say_what_is_wrong(entries, message):
    registry: Registry[type] = Registry("thing", entries, base=ClusterMedicError)
    with pytest.raises(PluginError, match=message):
        registry.load("x")


def test_unknown_plugin_lists_the_known_ones():
    registry: Registry[type] = Registry("thing", {"a": "m:A", "b": "m:B"})
    with pytest.raises(PluginError, match="registered: a, b"):
        registry.load("c")


def test_shared_data_dir_explains_when_absent(monkeypatch, tmp_path):
    from services.core.paths import shared_data_dir

    monkeypatch.setenv("CLUSTERMEDIC_SHARED_DATA", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="absent"):
        shared_data_dir()


def test_migration_files_are_numbered_and_load_in_order():
    from services.store.db import load_migrations

    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted({m.version for m in migrations})
    assert migrations[0].version == 1


def test_misnamed_migration_is_rejected(tmp_path):
    from services.core.errors import MigrationError
    from services.store.db import load_migrations

    (tmp_path / "1_init.sql").write_text("SELECT 1")
    with pytest.raises(MigrationError, match="NNNN_snake_case"):
        load_migrations(tmp_path)


def test_configuration_doc_lists_every_setting():
    from services.core.paths import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = [n for n in Settings.model_fields if f"CLUSTERMEDIC_{n.upper()}" not in doc]
    assert not missing, f"docs/configuration.md does not document {missing}"
