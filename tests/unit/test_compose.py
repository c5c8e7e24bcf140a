"""The deployment files: docker-compose.yml, infra/prometheus, infra/alertmanager, infra/grafana, infra/k8s.

docker-compose.yml is validated against the Compose Specification schema that Docker Compose v2
enforces (tests/fixtures/compose-spec.json, see compose-spec.NOTICE), then checked for what a user
would notice when running it: every role present and configured alike, dependencies that resolve,
mounted files that exist, and Prometheus/Alertmanager wired to ClusterMedic ingest.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from services.core.settings import Settings
from services.stack import ROLES

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "tests" / "fixtures" / "compose-spec.json"

# Each ClusterMedic role: compose service name -> the command it runs. The long-running roles come
# from the one list `medic stack` supervises; the migration job and the demo simulator are compose's.
ROLE_COMMANDS: dict[str, list[str]] = {
    "migrate": ["medic", "db", "migrate"],
    **{role.name: ["medic", *role.argv] for role in ROLES},
    "simulator": ["medic", "sim", "run", "--scenario", "random", "--sink", "kafka", "--speed", "1"],
}
INGEST_PORT = 8081
API_PORT = 8080
WEBHOOK_PATH = "/api/v1/alertmanager/webhook"
REMOTE_WRITE_PATH = "/api/v1/write"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    # The schema says "https://json-schema.org/draft-07/schema", a spelling jsonschema's
    # validator_for() does not recognise (it would fall back to 2020-12): name the draft.
    assert "draft-07" in schema["$schema"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(ROOT / "docker-compose.yml")


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    return command.split() if isinstance(command, str) else list(command or [])


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """depends_on in either syntax, as {target: condition}."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of every bind mount, short or long syntax."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            source, target = parts[0], parts[1]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


# --- schema ---------------------------------------------------------------------------------------


def test_schema_fixture_is_the_draft07_compose_spec(validator: jsonschema.protocols.Validator) -> None:
    assert validator.schema["$id"] == "compose_spec.json"
    # Current syntax the compose file relies on must be in this schema version.
    depends = validator.schema["definitions"]["service"]["properties"]["depends_on"]
    assert "service_completed_successfully" in json.dumps(depends)
    assert "profiles" in validator.schema["definitions"]["service"]["properties"]


def test_compose_file_is_valid_compose_spec(validator: jsonschema.protocols.Validator, compose: dict[str, Any]) -> None:
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    assert "version" not in compose, "top-level version: is obsolete in the Compose Specification"


@pytest.mark.parametrize(
    ("breakage", "where"),
    [
        (lambda c: c["services"]["api"].__setitem__("ports", "abc"), ["services", "api", "ports"]),
        (lambda c: c.__setitem__("servics", {}), []),
        (
            lambda c: c["services"]["kafka"].__setitem__("depends_on", {"redis": {"condition": "ready"}}),
            ["services", "kafka", "depends_on", "redis", "condition"],
        ),
    ],
    ids=["ports-not-a-list", "unknown-top-level-key", "unknown-depends-on-condition"],
)
def test_broken_compose_fails_validation(
    validator: jsonschema.protocols.Validator, compose: dict[str, Any], breakage: Any, where: list[str]
) -> None:
    broken = copy.deepcopy(compose)
    breakage(broken)
    errors = list(validator.iter_errors(broken))
    assert errors, "a broken compose file passed validation"

    def paths(error: jsonschema.ValidationError) -> list[list[Any]]:
        # oneOf/anyOf failures keep the per-branch errors, with the deeper paths, in .context.
        return [list(error.absolute_path), *(p for sub in error.context for p in paths(sub))]

    found = [p for e in errors for p in paths(e)]
    assert any(p[: len(where)] == where and len(p) >= len(where) for p in found), found


# --- ClusterMedic services --------------------------------------------------------------------------


def test_every_role_runs_its_command_with_the_shared_environment(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    shared = compose["x-clustermedic-env"]
    assert shared["CLUSTERMEDIC_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert shared["CLUSTERMEDIC_DATABASE_URL"] == "postgresql://clustermedic:clustermedic@postgres:5432/clustermedic"
    assert shared["CLUSTERMEDIC_REDIS_URL"] == "redis://redis:6379/0"
    images = set()
    for name, command in ROLE_COMMANDS.items():
        service = services.get(name)
        assert service is not None, f"service {name} is missing"
        assert _command(service) == command, name
        assert service["environment"] == shared, f"{name} does not use x-clustermedic-env"
        assert service["build"]["dockerfile"] == "Dockerfile"
        images.add(service["image"])
    assert len(images) == 1, f"roles should share one image, got {images}"
    assert (ROOT / "Dockerfile").is_file()


def test_shared_environment_names_real_settings() -> None:
    compose = _yaml(ROOT / "docker-compose.yml")
    fields = set(Settings.model_fields)
    for key in compose["x-clustermedic-env"]:
        assert key.startswith("CLUSTERMEDIC_")
        assert key.removeprefix("CLUSTERMEDIC_").lower() in fields, f"{key} is no Settings field"


def test_service_urls_point_at_compose_services(compose: dict[str, Any], services: dict[str, Any]) -> None:
    env = compose["x-clustermedic-env"]
    db = urlsplit(env["CLUSTERMEDIC_DATABASE_URL"])
    postgres_env = services["postgres"]["environment"]
    assert db.hostname in services and db.port == 5432
    assert (db.username, db.password, db.path.lstrip("/")) == (
        postgres_env["POSTGRES_USER"],
        postgres_env["POSTGRES_PASSWORD"],
        postgres_env["POSTGRES_DB"],
    )
    assert urlsplit(env["CLUSTERMEDIC_REDIS_URL"]).hostname in services
    # The bootstrap address must be one the broker advertises, or clients connect then lose it.
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//{env['CLUSTERMEDIC_KAFKA_BOOTSTRAP']}" in advertised


def test_only_the_simulator_and_the_events_watch_wait_for_a_profile(services: dict[str, Any]) -> None:
    # the events watch needs a kubeconfig, which a plain `docker compose up` cannot assume
    assert {name: s["profiles"] for name, s in services.items() if "profiles" in s} == {
        "simulator": ["demo"],
        "events": ["kubernetes"],
    }
    (mount,) = services["events"]["volumes"]
    assert mount["type"] == "bind" and mount["read_only"] is True
    assert mount["source"].startswith("${EVENTS_KUBECONFIG:-")  # the user's file, wherever it is
    # where the watcher looks without CLUSTERMEDIC_INGEST_K8S_KUBECONFIG: the medic user's home (Dockerfile)
    assert mount["target"] == "/var/lib/clustermedic/.kube/config"
    assert "--home-dir /var/lib/clustermedic" in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_published_ports(services: dict[str, Any]) -> None:
    def container_ports(service: dict[str, Any]) -> set[int]:
        return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}

    assert INGEST_PORT in container_ports(services["ingest"])
    assert API_PORT in container_ports(services["api"])


# --- dependencies -------------------------------------------------------------------------------------


def test_depends_on_targets_exist_and_health_conditions_have_healthchecks(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for target, condition in _depends_on(service).items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}'s health, it has none"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is one-shot, it must not restart"


def test_roles_wait_for_migrations_and_migrations_wait_for_postgres(services: dict[str, Any]) -> None:
    assert _depends_on(services["migrate"]) == {"postgres": "service_healthy"}
    assert "healthcheck" in services["postgres"]
    for name in ROLE_COMMANDS.keys() - {"migrate", "simulator"}:
        deps = _depends_on(services[name])
        assert deps.get("migrate") == "service_completed_successfully", name
        assert deps.get("kafka") == "service_healthy", name
        assert deps.get("redis") == "service_healthy", name
    assert _depends_on(services["simulator"]).get("kafka") == "service_healthy"


def test_no_dependency_cycle(services: dict[str, Any]) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for target in _depends_on(services[name]):
            visit(target, (*path, name))
        done.add(name)

    for name in services:
        visit(name, ())


# --- Kafka --------------------------------------------------------------------------------------------


def test_kafka_is_single_node_kraft(services: dict[str, Any]) -> None:
    assert not [n for n, s in services.items() if "zookeeper" in (n + str(s.get("image", ""))).lower()]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert not [k for k in env if "ZOOKEEPER" in k]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = str(env["KAFKA_NODE_ID"])
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voters == [f"{node_id}@kafka:9093"]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    # Every listener has a security protocol.
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocols)
    # Single broker: replicated internal topics would never become available.
    assert str(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == "1"


# --- mounted configuration ----------------------------------------------------------------------------


def test_every_bind_mount_exists_in_the_repo(services: dict[str, Any]) -> None:
    mounts = [(name, src, dst) for name, s in services.items() for src, dst in _bind_mounts(s)]
    assert mounts, "expected config mounts from ./infra"
    for name, source, _ in mounts:
        assert source.startswith("./infra/"), f"{name} mounts {source} from outside ./infra"
        assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repo"


def _mount_target(service: dict[str, Any], host_path: str) -> str:
    for source, target in _bind_mounts(service):
        if source.rstrip("/") == host_path:
            return target
    raise AssertionError(f"{host_path} is not mounted")


def test_prometheus_config_is_wired_to_alertmanager_and_ingest(services: dict[str, Any]) -> None:
    conf_dir = ROOT / "infra" / "prometheus"
    config = _yaml(conf_dir / "prometheus.yml")
    assert _mount_target(services["prometheus"], "./infra/prometheus") == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]

    (write,) = config["remote_write"]
    url = urlsplit(write["url"])
    assert (url.hostname, url.port, url.path) == ("ingest", INGEST_PORT, REMOTE_WRITE_PATH)
    assert write["authorization"]["credentials_file"] == _secret_path(services["prometheus"], "ingest_token")

    am_targets = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    assert am_targets == ["alertmanager:9093"] and "alertmanager" in services

    rule_files = [f for pattern in config["rule_files"] for f in conf_dir.glob(pattern)]
    assert rule_files, "rule_files matches nothing"
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            for pattern in sd["files"]:
                assert list(conf_dir.glob(pattern)), f"{job['job_name']}: {pattern} is missing"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert len(jobs) == len(config["scrape_configs"]), "duplicate job_name"
    assert {"dcgm-exporter", "vllm", "clustermedic"} <= set(jobs)
    assert jobs["vllm"]["kubernetes_sd_configs"][0]["role"] == "pod"
    scraped = {t for sc in jobs["clustermedic"]["static_configs"] for t in sc["targets"]}
    assert {f"ingest:{INGEST_PORT}", f"api:{API_PORT}"} <= scraped


def test_alerting_rules_cover_xid_temperature_and_kv_cache() -> None:
    rules = [
        rule
        for path in (ROOT / "infra" / "prometheus" / "rules").glob("*.yml")
        for group in _yaml(path)["groups"]
        for rule in group["rules"]
    ]
    exprs = " ".join(rule["expr"] for rule in rules)
    for metric in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "vllm:kv_cache_usage_perc"):
        assert metric in exprs
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_alertmanager_sends_every_alert_to_the_ingest_webhook(services: dict[str, Any]) -> None:
    host_path = "./infra/alertmanager/alertmanager.yml"
    assert _mount_target(services["alertmanager"], host_path) == "/etc/alertmanager/alertmanager.yml"
    config = _yaml(ROOT / host_path)
    receivers = {r["name"]: r for r in config["receivers"]}
    assert config["route"]["receiver"] in receivers
    (hook,) = receivers[config["route"]["receiver"]]["webhook_configs"]
    url = urlsplit(hook["url"])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "ingest", INGEST_PORT, WEBHOOK_PATH)
    assert url.hostname in services
    assert hook["send_resolved"] is True, "resolved notifications close incidents"
    token_file = hook["http_config"]["authorization"]["credentials_file"]
    assert token_file == _secret_path(services["alertmanager"], "ingest_token")


def _secret_path(service: dict[str, Any], name: str) -> str:
    """Where compose mounts a secret the service lists (short syntax: /run/secrets/<name>)."""
    assert name in service.get("secrets", []), f"the service does not mount the {name} secret"
    return f"/run/secrets/{name}"


def test_exposed_roles_need_their_tokens_and_the_senders_have_ingest_s(compose: dict[str, Any]) -> None:
    env = compose["x-clustermedic-env"]
    # both listen on every address of their container, which needs a token (services/core/exposure.py)
    for role in ("INGEST", "API"):
        assert env[f"CLUSTERMEDIC_{role}_HOST"] == "0.0.0.0"
        # ${VAR:?message}: compose refuses to start when the user has not set the token
        assert re.fullmatch(rf"\$\{{CLUSTERMEDIC_{role}_TOKEN:\?[^}}]+\}}", env[f"CLUSTERMEDIC_{role}_TOKEN"])
    assert compose["secrets"]["ingest_token"] == {"environment": "CLUSTERMEDIC_INGEST_TOKEN"}


def test_grafana_provisions_prometheus_and_the_gpu_dashboard(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    provisioning = ROOT / "infra" / "grafana" / "provisioning"
    assert _mount_target(grafana, "./infra/grafana/provisioning") == "/etc/grafana/provisioning"
    (datasource,) = _yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus"
    assert urlsplit(datasource["url"]).hostname == "prometheus"

    (provider,) = _yaml(provisioning / "dashboards" / "clustermedic.yml")["providers"]
    assert _mount_target(grafana, "./infra/grafana/dashboards") == provider["options"]["path"]

    (dashboard_path,) = (ROOT / "infra" / "grafana" / "dashboards").glob("*.json")
    dashboard = json.loads(dashboard_path.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == datasource["uid"]
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:kv_cache_usage_perc",
    ):
        assert metric in exprs, f"dashboard has no panel on {metric}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


# --- Kubernetes ---------------------------------------------------------------------------------------

K8S = ROOT / "infra" / "k8s"


@pytest.fixture(scope="module")
def k8s_objects() -> list[dict[str, Any]]:
    kustomization = _yaml(K8S / "kustomization.yaml")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "kustomization.yaml and the folder disagree"
    objects = [doc for name in kustomization["resources"] for doc in _yaml_all(K8S / name)]
    for obj in objects:
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"], obj
    return objects


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_k8s_has_one_deployment_per_long_running_role(k8s_objects: list[dict[str, Any]]) -> None:
    deployments = _by_kind(k8s_objects, "Deployment")
    namespaces = set(_by_kind(k8s_objects, "Namespace"))
    config_maps = set(_by_kind(k8s_objects, "ConfigMap"))
    accounts = set(_by_kind(k8s_objects, "ServiceAccount"))
    long_running = ROLE_COMMANDS.keys() - {"migrate", "simulator"}
    assert set(deployments) == {f"clustermedic-{role}" for role in long_running}
    (job,) = _by_kind(k8s_objects, "Job").values()
    workloads = {**{n.removeprefix("clustermedic-"): d for n, d in deployments.items()}, "migrate": job}
    for role, workload in workloads.items():
        assert workload["metadata"]["namespace"] in namespaces
        spec = workload["spec"]
        if workload["kind"] == "Deployment":
            labels = spec["template"]["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= labels.items(), role
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ROLE_COMMANDS[role], role
        refs = [e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e]
        assert refs and set(refs) <= config_maps, role
        if pod.get("automountServiceAccountToken", True):
            assert pod.get("serviceAccountName") in accounts, f"{role} mounts a token of an unknown account"


def test_k8s_services_reach_ingest_and_api(k8s_objects: list[dict[str, Any]]) -> None:
    deployments = _by_kind(k8s_objects, "Deployment")
    services = _by_kind(k8s_objects, "Service")
    assert set(services) == {"clustermedic-ingest", "clustermedic-api"}
    for name, port in (("clustermedic-ingest", INGEST_PORT), ("clustermedic-api", API_PORT)):
        service = services[name]
        selector = service["spec"]["selector"]
        pod = deployments[name]["spec"]["template"]
        assert selector.items() <= pod["metadata"]["labels"].items(), name
        (svc_port,) = service["spec"]["ports"]
        container_ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert svc_port["port"] == port and container_ports[svc_port["targetPort"]] == port, name


def test_k8s_rbac_grants_exactly_the_minimum(k8s_objects: list[dict[str, Any]]) -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for role in [*_by_kind(k8s_objects, "ClusterRole").values(), *_by_kind(k8s_objects, "Role").values()]:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == {
        ("", "events"): {"watch", "list", "get"},
        ("", "pods"): {"get", "list", "delete"},
        ("", "pods/eviction"): {"create"},
        ("apps", "deployments"): {"get", "patch"},
        ("apps", "deployments/scale"): {"get", "patch", "update"},
        ("apps", "replicasets"): {"list"},
        ("events.k8s.io", "events"): {"watch", "list", "get"},
        ("", "nodes"): {"get", "list", "patch"},
    }
    accounts = _by_kind(k8s_objects, "ServiceAccount")
    roles = set(_by_kind(k8s_objects, "ClusterRole"))
    for binding in _by_kind(k8s_objects, "ClusterRoleBinding").values():
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert subject["name"] in accounts
            assert subject["namespace"] == accounts[subject["name"]]["metadata"]["namespace"]


def test_k8s_events_watch_runs_once_with_an_account_that_only_reads_events(k8s_objects: list[dict[str, Any]]) -> None:
    deployments = _by_kind(k8s_objects, "Deployment")
    spec = deployments["clustermedic-events"]["spec"]
    # a second watcher, even for the length of a rolling update, publishes every event twice
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    account = spec["template"]["spec"]["serviceAccountName"]
    users = [n for n, d in deployments.items() if d["spec"]["template"]["spec"].get("serviceAccountName") == account]
    assert users == ["clustermedic-events"], "the events account is the events watch's alone"
    roles = _by_kind(k8s_objects, "ClusterRole")
    bound = [
        b["roleRef"]["name"]
        for b in _by_kind(k8s_objects, "ClusterRoleBinding").values()
        if any(subject["name"] == account for subject in b["subjects"])
    ]
    rules = [rule for name in bound for rule in roles[name]["rules"]]
    assert rules and all(r["resources"] == ["events"] and set(r["verbs"]) == {"get", "list", "watch"} for r in rules)
    assert {g for r in rules for g in r["apiGroups"]} == {"", "events.k8s.io"}  # both ingest_k8s_api choices


# --- documentation ------------------------------------------------------------------------------------


def test_deploy_doc_lists_every_environment_variable(
    compose: dict[str, Any], services: dict[str, Any], k8s_objects: list[dict[str, Any]]
) -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    names = set(compose["x-clustermedic-env"])
    for service in services.values():
        env = service.get("environment") or {}
        names.update(env if isinstance(env, dict) else (e.split("=", 1)[0] for e in env))
    for config_map in _by_kind(k8s_objects, "ConfigMap").values():
        names.update(config_map["data"])
    # ${VAR:-default} interpolations are variables the user sets too.
    names.update(re.findall(r"\$\{(\w+)", (ROOT / "docker-compose.yml").read_text(encoding="utf-8")))
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/deploy.md does not list {missing}"


def test_every_role_command_is_a_real_medic_command() -> None:
    import typer

    from services.cli import app

    for role, command in ROLE_COMMANDS.items():
        assert command[0] == "medic", role
        cmd: Any = typer.main.get_command(app)
        args = command[1:]
        # typer builds on its own copy of click: a group is whatever has sub-commands
        while getattr(cmd, "commands", None) and args and args[0] in cmd.commands:
            cmd, args = cmd.commands[args[0]], args[1:]
        assert not getattr(cmd, "commands", None), f"{role}: {command} names a command group, not a command"
        # parsing the remaining words must succeed: an unknown option or a missing argument fails here
        cmd.make_context("medic", list(args), resilient_parsing=False)


def test_optional_nvml_daemonset_runs_a_real_command_on_gpu_nodes_labelled_by_node_name() -> None:
    import typer

    from services.cli import app

    (daemonset,) = _yaml_all(K8S / "optional" / "nvml-daemonset.yaml")
    assert daemonset["kind"] == "DaemonSet"
    pod = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    # no GPU requested: the collector must not take a GPU away from serving
    assert "nvidia.com/gpu" not in str(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    assert env["CLUSTERMEDIC_INGEST_NVML_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    command = container["command"]
    assert command[:3] == ["medic", "ingest", "nvml"]
    cmd: Any = typer.main.get_command(app).commands["ingest"].commands["nvml"]  # type: ignore[attr-defined]
    ctx = cmd.make_context("nvml", command[3:], resilient_parsing=False)
    port = ctx.params["listen"].rsplit(":", 1)[1]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(port) == 9400  # dcgm-exporter's port, so existing scrape configs fit
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
