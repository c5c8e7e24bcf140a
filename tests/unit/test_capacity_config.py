"""capacity.yaml: the shipped file loads, and every mistake names the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.capacity.config import DEFAULT_CONFIG, CapacityConfig, load_config
from services.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "capacity.yaml"
    path.write_text(text)
    return path


GOOD_VARIANT = "variants:\n  v: {model: m, gpu_type: h100, prior_tokens_per_s: 100}\n"


def test_the_shipped_config_loads_and_prices_every_variant() -> None:
    cfg = load_config()
    assert cfg.variants
    for name in cfg.variants:
        assert cfg.replica_usd_per_hour(name) > 0


def test_a_variant_on_a_gpu_with_no_price_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "gpu_prices: {a100: 2.5}\n" + GOOD_VARIANT)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert "variants.v.gpu_type" in str(err.value) and "'h100'" in str(err.value)


def test_a_misspelt_key_is_refused_not_defaulted(tmp_path: Path) -> None:
    path = write(tmp_path, "gpu_prices: {h100: 4}\nhysteresis: {down_cooldown: 60}\n" + GOOD_VARIANT)
    with pytest.raises(ConfigError, match=r"hysteresis\.down_cooldown"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("gpu_prices: {h100: 0}\n" + GOOD_VARIANT, "gpu_prices.h100"),
        (
            "gpu_prices: {h100: 4}\nvariants:\n"
            "  v: {model: m, gpu_type: h100, min_replicas: 0, prior_tokens_per_s: 1}\n",
            "variants.v.min_replicas",
        ),
        (
            "gpu_prices: {h100: 4}\nvariants:\n  v: {model: m, gpu_type: h100, min_replicas: 3, max_replicas: 2, "
            "prior_tokens_per_s: 1}\n",
            "variants.v",
        ),
        ("gpu_prices: {h100: 4}\nvariants:\n  v: {model: m, gpu_type: h100}\n", "variants.v.prior_tokens_per_s"),
        ("saturation: {kv_cache: 1.5}\n", "saturation.kv_cache"),
    ],
)
def test_bad_values_name_their_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert key in str(err.value)


def test_a_missing_or_non_mapping_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def _fields(model: type[CapacityConfig]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        sub = info.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            names |= _fields(sub)
    return names


def test_every_setting_is_documented_in_the_shipped_file_and_the_docs() -> None:
    from services.capacity.config import VariantConfig

    shipped = DEFAULT_CONFIG.read_text()
    docs = (ROOT / "docs" / "capacity.md").read_text()
    for name in _fields(CapacityConfig) | set(VariantConfig.model_fields):
        assert re.search(rf"\b{name}\b", shipped), f"{name} is not in {DEFAULT_CONFIG.name}"
        assert f"`{name}`" in docs, f"{name} is not documented in docs/capacity.md"
