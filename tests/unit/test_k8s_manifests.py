"""infra/k8s NetworkPolicies and tokens (issue 13, item 2): each Service port admits exactly the peers
that need it, the namespace denies everything else, and the exposed roles take their token from a Secret.

The policies are evaluated here the way the NetworkPolicy API defines them: a pod is isolated for
ingress once any policy selects it, and then admits the union of the selecting policies' rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
NAMESPACE = "clustermedic"

# A peer as (namespace labels, pod labels); None for the namespace means "the policy's own namespace".
Peer = tuple[tuple[tuple[str, str], ...] | None, tuple[tuple[str, str], ...]]
MONITORING = (("kubernetes.io/metadata.name", "monitoring"),)


def _pod(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


# Who must reach each Service port, and nobody else.
INTENDED: dict[str, set[Peer]] = {
    "clustermedic-ingest": {
        (MONITORING, _pod(**{"app.kubernetes.io/name": name}))
        for name in ("prometheus", "alertmanager", "promtail", "alloy")
    },
    "clustermedic-api": {
        (None, _pod(**{"app.kubernetes.io/name": "clustermedic", "app.kubernetes.io/component": "console"})),
        (
            (("kubernetes.io/metadata.name", "ingress-nginx"),),
            _pod(**{"app.kubernetes.io/name": "ingress-nginx"}),
        ),
        (MONITORING, _pod(**{"app.kubernetes.io/name": "prometheus"})),
    },
}
# Pods that must NOT reach a Service port: other workloads, other monitoring pods, ClusterMedic's own
# roles that have no business there (a compromised diagnostician must not push fake alerts).
OUTSIDERS: list[Peer] = [
    (None, _pod(**{"app.kubernetes.io/name": "clustermedic", "app.kubernetes.io/component": "diagnostician"})),
    ((("kubernetes.io/metadata.name", "default"),), _pod(app="vllm")),
    (MONITORING, _pod(**{"app.kubernetes.io/name": "grafana"})),
    ((("kubernetes.io/metadata.name", "llm-serving"),), _pod(**{"app.kubernetes.io/name": "prometheus"})),
]
DATASTORE_PORTS = {"postgresql": 5432, "redis": 6379, "kafka": 9092}


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")) if d]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert "networkpolicies.yaml" in kustomization["resources"]
    return [doc for name in kustomization["resources"] for doc in _docs(name)]


def _kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_admitted(rule_peer: dict[str, Any], peer: Peer) -> bool:
    namespace_labels, pod_labels = peer
    ns = dict(namespace_labels) if namespace_labels is not None else {"kubernetes.io/metadata.name": NAMESPACE}
    if "ipBlock" in rule_peer:
        return True  # any address range admits every pod in it: the test treats it as everyone
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], ns):
            return False
    elif ns.get("kubernetes.io/metadata.name") != NAMESPACE:
        return False  # a bare podSelector means pods of the policy's own namespace
    return _selects(rule_peer.get("podSelector", {}), dict(pod_labels))


def _admits(policies: list[dict[str, Any]], pod_labels: dict[str, str], port: int, peer: Peer) -> bool:
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pod_labels)]
    assert selecting, f"no NetworkPolicy selects {pod_labels}: it is open to everyone"
    for policy in selecting:
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") in (port, "http") for p in ports):
                continue
            peers = rule.get("from")
            assert peers, f"{policy['metadata']['name']} has a rule without 'from': it admits everyone"
            if any(_peer_admitted(rp, peer) for rp in peers):
                return True
    return False


def _all_peers() -> set[Peer]:
    return {peer for peers in INTENDED.values() for peer in peers} | set(OUTSIDERS)


def test_the_namespace_denies_all_ingress_by_default(objects: list[dict[str, Any]]) -> None:
    policies = _kind(objects, "NetworkPolicy")
    deny = [
        p
        for p in policies.values()
        if p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"] and not p["spec"].get("ingress")
    ]
    assert len(deny) == 1 and deny[0]["metadata"]["namespace"] == NAMESPACE


def test_each_service_port_admits_exactly_the_intended_peers(objects: list[dict[str, Any]]) -> None:
    policies = list(_kind(objects, "NetworkPolicy").values())
    deployments = _kind(objects, "Deployment")
    services = _kind(objects, "Service")
    assert set(services) == set(INTENDED)
    for name, service in services.items():
        pod_labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert _selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
        for port in service["spec"]["ports"]:
            container = deployments[name]["spec"]["template"]["spec"]["containers"][0]
            number = {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]]
            admitted = {peer for peer in _all_peers() if _admits(policies, pod_labels, number, peer)}
            assert admitted == INTENDED[name], name
            # no other port of the pod is open to the intended peers
            assert not any(_admits(policies, pod_labels, number + 1, peer) for peer in INTENDED[name]), name


def test_data_stores_admit_only_clustermedic_roles(objects: list[dict[str, Any]]) -> None:
    policies = list(_kind(objects, "NetworkPolicy").values())
    workloads = [*_kind(objects, "Deployment").values(), *_kind(objects, "Job").values()]
    roles = [w["spec"]["template"]["metadata"]["labels"] for w in workloads]
    assert len(roles) >= 8
    for store, port in DATASTORE_PORTS.items():
        labels = {"app.kubernetes.io/name": store}
        for role in roles:
            assert _admits(policies, labels, port, (None, tuple(sorted(role.items())))), (store, role)
        for peer in [*OUTSIDERS[1:], *(p for peers in INTENDED.values() for p in peers if p[0] is not None)]:
            assert not _admits(policies, labels, port, peer), (store, peer)


def test_exposed_roles_listen_on_all_addresses_with_a_token_from_a_secret(objects: list[dict[str, Any]]) -> None:
    deployments = _kind(objects, "Deployment")
    for name, variable in (("clustermedic-ingest", "INGEST"), ("clustermedic-api", "API")):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container.get("env", [])}
        assert env[f"CLUSTERMEDIC_{variable}_HOST"]["value"] == "0.0.0.0", name
        secret = env[f"CLUSTERMEDIC_{variable}_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert secret["name"] == "clustermedic-secrets" and secret["key"], name
        assert not secret.get("optional", False), f"{name} must not start without its token"
    # no other role binds a port, so none needs a token
    for name, deployment in deployments.items():
        if name not in ("clustermedic-ingest", "clustermedic-api"):
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            assert not container.get("ports"), name
