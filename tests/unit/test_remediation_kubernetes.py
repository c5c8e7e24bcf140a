"""The Kubernetes actuator against a local HTTP server that speaks the Kubernetes API for the verbs used."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from services.remediation.actuators.kubernetes import RESTARTED_AT, KubernetesActuator
from services.remediation.config import ActuatorConfig
from services.remediation.errors import ActuatorError, ActuatorUnsupported
from services.remediation.model import ActionSpec, VerifySpec


def deployment(name: str, replicas: int, args: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "llm", "annotations": {"deployment.kubernetes.io/revision": "3"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": args}]},
            },
        },
        "status": {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas},
    }


def pod(name: str, node: str, owner_kind: str = "ReplicaSet", owner: str = "llama-7d9f") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner, "uid": "u"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeKube:
    """Just enough of the API server: state, a request log, and a PodDisruptionBudget that refuses."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.deployments = {"llama": deployment("llama", 2, ["--model", "llama", "--max-num-seqs=256"])}
        self.nodes = {
            "n1": {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "n1"},
                "spec": {},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "capacity": {"nvidia.com/gpu": "8"},
                    "allocatable": {"nvidia.com/gpu": "7"},
                },
            }
        }
        self.pods = {
            "llama-7d9f-a": pod("llama-7d9f-a", "n1"),
            "llama-7d9f-b": pod("llama-7d9f-b", "n1"),
            "dcgm-exporter-x": pod("dcgm-exporter-x", "n1", "DaemonSet", "dcgm-exporter"),
        }
        self.pdb_protected: dict[str, int] = {}  # pod -> 429s left before the budget allows it (-1: never)

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, body))
        parts = path.strip("/").split("/")
        if path == "/api/v1/pods":
            node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
            items = [p for p in self.pods.values() if p["spec"]["nodeName"] == node]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if parts[:3] == ["api", "v1", "nodes"]:
            node = self.nodes.get(parts[3])
            if node is None:
                return 404, status(404, "NotFound", f'nodes "{parts[3]}" not found')
            if method == "PATCH":
                node["spec"].update(body["spec"])
            return 200, node
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            name = parts[5]
            if name not in self.pods:
                return 404, status(404, "NotFound", f'pods "{name}" not found')
            if len(parts) == 7 and parts[6] == "eviction":
                left = self.pdb_protected.get(name, 0)
                if left != 0:
                    self.pdb_protected[name] = left - 1 if left > 0 else -1
                    return 429, status(
                        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
                    )
                del self.pods[name]
                return 201, status(201, "", "")
            if method == "DELETE":
                return 200, self.pods.pop(name)
            return 200, self.pods[name]
        if parts[:4] == ["apis", "apps", "v1", "namespaces"] and parts[5] == "deployments":
            dep = self.deployments.get(parts[6])
            if dep is None:
                return 404, status(404, "NotFound", "deployment not found")
            if len(parts) == 8 and parts[7] == "scale":
                dep["spec"]["replicas"] = body["spec"]["replicas"]
                return 200, {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {"name": parts[6], "namespace": "llm"},
                    "spec": {"replicas": dep["spec"]["replicas"]},
                    "status": {"replicas": dep["spec"]["replicas"]},
                }
            if method == "PATCH":
                merge(dep, body)
            return 200, dep
        return 404, status(404, "NotFound", path)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "code": code, "reason": reason, "message": message}


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """Strategic merge, as far as this test needs: containers merge by name."""
    for key, value in patch.items():
        if key == "containers":
            by_name = {c["name"]: c for c in target.get(key, [])}
            for c in value:
                by_name.setdefault(c["name"], {}).update(c)
            target[key] = list(by_name.values())
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


@pytest.fixture
def kube() -> Iterator[tuple[FakeKube, KubernetesActuator]]:
    fake = FakeKube()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            n = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            code, out = fake.handle(self.command, url.path, parse_qs(url.query), body)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, for every test
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    config = ActuatorConfig(
        kind="kubernetes",
        url=f"http://127.0.0.1:{server.server_address[1]}",
        options={"evict_timeout_s": 0.3, "evict_retry_s": 0.05, "container": "vllm"},
    )
    actuator = KubernetesActuator.from_config(config)
    yield fake, actuator
    actuator.close()
    server.shutdown()
    server.server_close()


def test_delete_pod_rollout_restart_and_scale(kube):
    fake, act = kube
    act.act(ActionSpec(op="restart_pod", target="llama-7d9f-a", namespace="llm"))
    assert ("DELETE", "/api/v1/namespaces/llm/pods/llama-7d9f-a", None) in fake.requests
    act.act(ActionSpec(op="rollout_restart", target="llama", namespace="llm"))
    annotations = fake.deployments["llama"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations[RESTARTED_AT].endswith("Z")
    act.act(ActionSpec(op="scale", target="llama", namespace="llm", params={"replicas": 4}))
    assert fake.requests[-1][:2] == ("PATCH", "/apis/apps/v1/namespaces/llm/deployments/llama/scale")
    assert fake.deployments["llama"]["spec"]["replicas"] == 4


def test_patch_args_reads_back_through_describe(kube):
    fake, act = kube
    act.act(ActionSpec(op="set_max_num_seqs", target="llama", namespace="llm", params={"max_num_seqs": 128}))
    args = fake.deployments["llama"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["--model", "llama", "--max-num-seqs=128"]
    assert act.describe("deployment", "llama", "llm")["max_num_seqs"] == 128
    assert act.check(
        VerifySpec(check="deployment_ready", target="llama", namespace="llm", params={"max_num_seqs": 128})
    ).ok


def test_cordon_and_uncordon_patch_unschedulable(kube):
    fake, act = kube
    act.act(ActionSpec(op="cordon_node", target="n1"))
    assert fake.requests[-1] == ("PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": True}})
    assert act.check(VerifySpec(check="node_unschedulable", target="n1")).ok
    act.act(ActionSpec(op="uncordon_node", target="n1"))
    assert act.describe("node", "n1")["schedulable"] is True
    assert act.describe("node", "n1")["unhealthy_gpus"] == 1
    assert act.describe("node", "nope") is None


def test_drain_evicts_workload_pods_and_retries_a_budget_that_frees_up(kube):
    fake, act = kube
    fake.pdb_protected["llama-7d9f-b"] = 2  # refused twice, then allowed
    outcome = act.act(ActionSpec(op="drain_node", target="n1"))
    assert sorted(outcome.data["evicted"]) == ["llm/llama-7d9f-a", "llm/llama-7d9f-b"]
    evictions = [r for r in fake.requests if r[1].endswith("/eviction")]
    assert (
        evictions[0][2]["kind"] == "Eviction"
        and evictions[0][2]["apiVersion"] == "policy/v1"
        and evictions[0][2]["metadata"]["name"]
    )
    assert "dcgm-exporter-x" in fake.pods, "DaemonSet pods are left alone"
    assert fake.nodes["n1"]["spec"]["unschedulable"] is True
    assert act.check(VerifySpec(check="node_drained", target="n1")).ok


def test_drain_fails_when_a_pod_disruption_budget_keeps_refusing(kube):
    fake, act = kube
    fake.pdb_protected["llama-7d9f-b"] = -1
    with pytest.raises(ActuatorError, match=r"PodDisruptionBudget.*llama-7d9f-b.*disruption budget"):
        act.act(ActionSpec(op="drain_node", target="n1"))
    assert "llama-7d9f-b" in fake.pods and "llama-7d9f-a" not in fake.pods


def test_gpu_reset_and_reboot_are_not_offered(kube):
    _, act = kube
    assert not act.supports("reset_gpu") and not act.supports("reboot_node")
    with pytest.raises(ActuatorUnsupported):
        act.act(ActionSpec(op="reboot_node", target="n1"))


def _on_gpus(p: dict[str, Any], gpus: int, ready: bool, restarts: int = 0) -> dict[str, Any]:
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    p["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    state = (
        {"waiting": {"reason": "CrashLoopBackOff"}} if restarts else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    )
    p["status"]["containerStatuses"] = [
        {"name": "vllm", "image": "x", "imageID": "", "ready": ready, "restartCount": restarts, "state": state}
    ]
    return p


def test_the_pods_a_failed_gpu_took_down_are_the_gpu_pods_not_ready_on_a_node_short_of_gpus(kube):
    fake, act = kube
    _on_gpus(fake.pods["llama-7d9f-a"], 4, ready=False, restarts=3)  # crash-looping on the GPU off the bus
    _on_gpus(fake.pods["llama-7d9f-b"], 4, ready=True)  # on healthy GPUs: serving
    fake.pods["llama-7d9f-c"] = _on_gpus(pod("llama-7d9f-c", "n1"), 1, ready=False)  # still loading its model
    fake.pods["exporter-0"] = pod("exporter-0", "n1", "StatefulSet", "exporter")  # no GPUs
    fake.pods["exporter-0"]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert act.describe("node", "n1")["failed_gpu_pods"] == [
        {"pod": "llama-7d9f-a", "namespace": "llm", "deployment": "llama", "ready": False}
    ]
    # every GPU allocatable again (the device plugin sees them all healthy): a pod not Ready is not the GPU's
    fake.nodes["n1"]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    assert act.describe("node", "n1")["failed_gpu_pods"] == []


def test_evict_gpu_pods_runs_on_kubernetes_with_real_api_calls(kube):
    from services.remediation.registry import load_playbook, playbook_registry

    fake, act = kube
    _on_gpus(fake.pods["llama-7d9f-a"], 4, ready=False, restarts=3)
    _on_gpus(fake.pods["llama-7d9f-b"], 4, ready=True)
    pb = load_playbook(playbook_registry(), "evict_gpu_pods")
    params = pb.parse({"node": "n1", "namespace": "llm"})
    pre = pb.precheck(params, act)
    assert pre.ok, pre.reason
    assert not [r for r in fake.requests if r[0] != "GET"], "the precheck changed something"
    steps = pb.steps(params, pre.observed)
    for step in steps:
        if step.action is not None:
            act.act(step.action)
    assert [r for r in fake.requests if r[0] != "GET"] == [
        ("PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": True}}),
        ("DELETE", "/api/v1/namespaces/llm/pods/llama-7d9f-a", None),
    ]
    assert "llama-7d9f-b" in fake.pods, "a pod still serving is left alone"
    assert [act.check(s.verify).ok for s in steps if s.verify] == [True, True, True]
    fake.deployments["llama"]["status"]["readyReplicas"] = 1  # the replacement is not Ready yet
    assert not act.check(steps[-1].verify).ok
    for step in pb.rollback(params, pre.observed):
        assert step.action is not None
        act.act(step.action)
    assert fake.nodes["n1"]["spec"]["unschedulable"] is False
