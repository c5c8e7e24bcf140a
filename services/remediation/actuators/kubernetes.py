"""The Kubernetes actuator (official ``kubernetes`` client).

Verbs used (infra/k8s/rbac.yaml must grant them): pods get/list/delete, pods/eviction create,
deployments get/patch, deployments/scale patch, replicasets list (rollback), nodes get/list/patch.

* restart / delete pod: ``DELETE pod`` (its ReplicaSet replaces it);
* rollout restart: patch the pod template annotation ``kubectl.kubernetes.io/restartedAt``;
* scale: patch ``deployments/scale``;
* set_max_num_seqs / switch_variant: patch the vLLM container's args (``--max-num-seqs``, or the
  ``args`` mapping the step gives, e.g. ``{"--model": ..., "--max-model-len": ...}``);
* cordon / uncordon: patch ``spec.unschedulable``;
* the pods a failed GPU took down (the node view's ``failed_gpu_pods``): when the node reports fewer
  allocatable ``nvidia.com/gpu`` than its capacity (the device plugin marked a GPU unhealthy), its
  workload pods that request GPUs, are not Ready and whose container died (restarts, terminated, or
  waiting in CrashLoopBackOff and the like; a pod still loading its model is not one);
  ``evict_gpu_pods`` deletes them;
* drain: cordon, then evict every workload pod through the eviction API, which honours
  PodDisruptionBudgets (HTTP 429); refused evictions are retried until ``evict_timeout_s``, then the
  drain fails naming the pods the budget protects;
* rollback: copy the previous ReplicaSet revision's pod template back into the deployment.

GPU reset and node reboot need a node agent (a privileged DaemonSet); this actuator does not offer them.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from services.remediation.actuators.base import Actuator, ObjectKind
from services.remediation.config import ActuatorConfig
from services.remediation.errors import ActuatorError, ActuatorUnsupported
from services.remediation.model import ActionOutcome, ActionSpec

GPU_RESOURCE = "nvidia.com/gpu"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
REVISION = "deployment.kubernetes.io/revision"
VARIANT = "clustermedic.io/variant"


class KubernetesActuator(Actuator):
    """Acts on a Kubernetes cluster.

    Args:
        api_client: a configured ``kubernetes.client.ApiClient``.
        evict_timeout_s: how long a drain keeps retrying evictions a PodDisruptionBudget refuses.
        evict_retry_s: pause between those retries.
        container: name of the vLLM container (default: the first container).
    """

    name = "kubernetes"
    operations = frozenset(
        {
            "restart_pod",
            "delete_pod",
            "rollout_restart",
            "scale",
            "set_max_num_seqs",
            "switch_variant",
            "rollback_deployment",
            "cordon_node",
            "uncordon_node",
            "drain_node",
        }
    )

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        evict_timeout_s: float = 300.0,
        evict_retry_s: float = 5.0,
        container: str = "",
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.evict_timeout_s = evict_timeout_s
        self.evict_retry_s = evict_retry_s
        self.container = container
        self._api_client = api_client

    @classmethod
    def from_config(cls, config: ActuatorConfig) -> KubernetesActuator:
        """Options: ``kubeconfig`` (path), ``in_cluster`` (bool), ``token``, ``verify_ssl``, ``container``,
        ``evict_timeout_s``; without kubeconfig/in_cluster, ``url`` is the API server."""
        from kubernetes import config as kube_config

        opts = config.options
        if opts.get("in_cluster"):
            kube_config.load_incluster_config()
            api = client.ApiClient()
        elif opts.get("kubeconfig"):
            api = kube_config.new_client_from_config(config_file=str(opts["kubeconfig"]))
        else:
            conf = client.Configuration()
            conf.host = config.url
            conf.verify_ssl = bool(opts.get("verify_ssl", True))
            if opts.get("token"):
                conf.api_key = {"authorization": f"Bearer {opts['token']}"}
            api = client.ApiClient(conf)
        return cls(
            api,
            evict_timeout_s=float(opts.get("evict_timeout_s", 300.0)),
            evict_retry_s=float(opts.get("evict_retry_s", 5.0)),
            container=str(opts.get("container", "")),
        )

    def close(self) -> None:
        self._api_client.close()

    def clock(self) -> float:
        return time.time()

    # ------------------------------------------------------------------------------ actions

    def act(self, action: ActionSpec) -> ActionOutcome:
        ns, name, p = action.namespace or "default", action.target, action.params
        try:
            if action.op in ("restart_pod", "delete_pod"):
                self.core.delete_namespaced_pod(name, ns)
                return ActionOutcome(message=f"deleted pod {ns}/{name}")
            if action.op == "rollout_restart":
                now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                body = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
                self.apps.patch_namespaced_deployment(name, ns, body)
                return ActionOutcome(message=f"restarted {ns}/{name} at {now}")
            if action.op == "scale":
                self.apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": int(p["replicas"])}})
                return ActionOutcome(message=f"scaled {ns}/{name} to {p['replicas']}")
            if action.op == "set_max_num_seqs":
                return self._patch_args(name, ns, {"--max-num-seqs": str(int(p["max_num_seqs"]))}, None)
            if action.op == "switch_variant":
                args = p.get("args")
                if not isinstance(args, dict) or not args:
                    raise ActuatorError("kubernetes switch_variant needs params.args (flag -> value)")
                return self._patch_args(name, ns, {str(k): str(v) for k, v in args.items()}, str(p["variant"]))
            if action.op == "rollback_deployment":
                return self._rollback(name, ns)
            if action.op in ("cordon_node", "uncordon_node"):
                self.core.patch_node(name, {"spec": {"unschedulable": action.op == "cordon_node"}})
                return ActionOutcome(message=f"{action.op.split('_')[0]}ed {name}")
            if action.op == "drain_node":
                return self._drain(name)
        except ApiException as exc:
            raise ActuatorError(f"kubernetes {action.op} {ns}/{name}: {exc.status} {exc.reason}") from exc
        except KeyError as exc:
            raise ActuatorError(f"kubernetes {action.op}: missing parameter {exc}") from exc
        raise ActuatorUnsupported(f"the kubernetes actuator cannot {action.op} (needs a node agent)")

    def _container(self, dep: Any) -> Any:
        containers = dep.spec.template.spec.containers
        for c in containers:
            if not self.container or c.name == self.container:
                return c
        raise ActuatorError(f"no container {self.container!r} in {dep.metadata.name}")

    def _patch_args(self, name: str, ns: str, flags: dict[str, str], variant: str | None) -> ActionOutcome:
        dep = self.apps.read_namespaced_deployment(name, ns)
        c = self._container(dep)
        args = _set_flags(list(c.args or []), flags)
        body: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [{"name": c.name, "args": args}]}}}}
        if variant:
            body["metadata"] = {"annotations": {VARIANT: variant}}
        self.apps.patch_namespaced_deployment(name, ns, body)
        return ActionOutcome(message=f"patched {ns}/{name} args", data={"args": args})

    def _rollback(self, name: str, ns: str) -> ActionOutcome:
        dep = self.apps.read_namespaced_deployment(name, ns)
        selector = ",".join(f"{k}={v}" for k, v in (dep.spec.selector.match_labels or {}).items())
        rss: list[Any] = self.apps.list_namespaced_replica_set(ns, label_selector=selector).items
        owned = [
            rs
            for rs in rss
            if any(o.kind == "Deployment" and o.name == name for o in (rs.metadata.owner_references or []))
        ]
        owned.sort(key=lambda rs: int((rs.metadata.annotations or {}).get(REVISION, "0")))
        if len(owned) < 2:
            raise ActuatorError(f"{ns}/{name} has no previous revision")
        template = self._api_client.sanitize_for_serialization(owned[-2].spec.template)
        template.get("metadata", {}).get("labels", {}).pop("pod-template-hash", None)
        self.apps.patch_namespaced_deployment(name, ns, {"spec": {"template": template}})
        rev = (owned[-2].metadata.annotations or {}).get(REVISION)
        return ActionOutcome(message=f"rolled {ns}/{name} back to revision {rev}")

    def _workload_pods(self, node: str) -> list[Any]:
        pods: list[Any] = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        out = []
        for pod in pods:
            if "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
                continue  # static pods cannot be evicted
            if any(o.kind == "DaemonSet" for o in (pod.metadata.owner_references or [])):
                continue  # kubectl drain --ignore-daemonsets
            if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                continue
            out.append(pod)
        return out

    def _drain(self, node: str) -> ActionOutcome:
        self.core.patch_node(node, {"spec": {"unschedulable": True}})
        pending = {(p.metadata.namespace, p.metadata.name) for p in self._workload_pods(node)}
        evicted: list[str] = []
        deadline = time.monotonic() + self.evict_timeout_s
        blocked: dict[str, str] = {}
        while pending:
            for ns, pod in sorted(pending):
                body = client.V1Eviction(
                    api_version="policy/v1", kind="Eviction", metadata=client.V1ObjectMeta(name=pod, namespace=ns)
                )
                try:
                    self.core.create_namespaced_pod_eviction(pod, ns, body)
                except ApiException as exc:
                    if exc.status == 404:
                        pending.discard((ns, pod))
                        continue
                    if exc.status == 429:  # a PodDisruptionBudget refuses for now
                        blocked[f"{ns}/{pod}"] = _message(exc)
                        continue
                    raise
                pending.discard((ns, pod))
                blocked.pop(f"{ns}/{pod}", None)
                evicted.append(f"{ns}/{pod}")
            if not pending:
                break
            if time.monotonic() + self.evict_retry_s > deadline:
                raise ActuatorError(
                    f"drain {node}: eviction refused by a PodDisruptionBudget for "
                    + "; ".join(f"{k} ({v})" for k, v in sorted(blocked.items()))
                    + f"; evicted {len(evicted)}"
                )
            time.sleep(self.evict_retry_s)
        return ActionOutcome(message=f"drained {node}: evicted {len(evicted)} pods", data={"evicted": evicted})

    # ----------------------------------------------------------------------------- reading

    def describe(self, kind: ObjectKind, name: str, namespace: str = "") -> dict[str, Any] | None:
        ns = namespace or "default"
        try:
            if kind == "deployment":
                dep: Any = self.apps.read_namespaced_deployment(name, ns)
                st = dep.status
                ready = min(st.ready_replicas or 0, st.updated_replicas or 0) if st else 0
                args = list(self._container(dep).args or [])
                seqs = _flag(args, "--max-num-seqs")
                ann = dep.metadata.annotations or {}
                return {
                    "replicas": int(dep.spec.replicas or 0),
                    "ready": ready,
                    "max_num_seqs": int(seqs) if seqs else None,
                    "variant": ann.get(VARIANT),
                    "revision": ann.get(REVISION),
                    # this actuator drains no replica: every Ready pod, old revision or new, is an endpoint
                    "in_rotation": int(st.ready_replicas or 0) if st else 0,
                }
            if kind == "pod":
                pod: Any = self.core.read_namespaced_pod(name, ns)
                return {
                    "phase": pod.status.phase if pod.status else "Unknown",
                    "node": pod.spec.node_name or "",
                    "deployment": _deployment_of(pod),
                    "ready": _pod_ready(pod),
                    "in_rotation": _pod_ready(pod),
                }
            if kind == "node":
                node: Any = self.core.read_node(name)
                conds = {c.type: c.status for c in (node.status.conditions or [])}
                cap = (node.status.capacity or {}).get(GPU_RESOURCE, "0")
                alloc = (node.status.allocatable or {}).get(GPU_RESOURCE, "0")
                unhealthy = max(0, int(cap) - int(alloc))
                pods = self._workload_pods(name)
                # Which device a pod holds is the kubelet's, not the API's: a GPU pod a failed GPU took down
                # is not Ready and its container died (crash-looping); a pod still loading its model has not.
                failed = [_pod_ref(p) for p in pods if unhealthy and _gpus_requested(p) and _failing(p)]
                return {
                    "ready": conds.get("Ready") == "True",
                    "schedulable": not node.spec.unschedulable,
                    "rebooting": False,
                    "pods": len(pods),
                    "unhealthy_gpus": unhealthy,
                    "failed_gpu_pods": failed,
                }
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ActuatorError(f"kubernetes read {kind} {name}: {exc.status} {exc.reason}") from exc
        return None  # GPUs are not Kubernetes objects


def _pod_ready(pod: Any) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
    return conds.get("Ready") == "True"


def _deployment_of(pod: Any) -> str:
    """The Deployment owning a pod through its ReplicaSet (``<deployment>-<pod-template-hash>``), or ""."""
    owner = next((o.name for o in (pod.metadata.owner_references or []) if o.kind == "ReplicaSet"), "")
    return owner.rsplit("-", 1)[0] if owner else ""


def _gpus_requested(pod: Any) -> bool:
    """Whether a container of the pod asks for GPUs (extended resources are whole numbers)."""
    for c in pod.spec.containers or []:
        res = c.resources
        for quantities in (res.limits, res.requests) if res is not None else ():
            if str((quantities or {}).get(GPU_RESOURCE, "0")).strip() not in ("", "0"):
                return True
    return False


def _failing(pod: Any) -> bool:
    """Whether the pod is not Ready and a container of it died or cannot start (restarts, CrashLoopBackOff)."""
    if _pod_ready(pod) or pod.status is None:
        return False
    for st in pod.status.container_statuses or []:
        waiting = st.state.waiting if st.state is not None else None
        if (st.restart_count or 0) > 0 or (st.state is not None and st.state.terminated is not None):
            return True
        if waiting is not None and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
            return True
    return False


def _pod_ref(pod: Any) -> dict[str, Any]:
    return {
        "pod": pod.metadata.name,
        "namespace": pod.metadata.namespace,
        "deployment": _deployment_of(pod),
        "ready": _pod_ready(pod),
    }


def _flag(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def _set_flags(args: list[str], flags: dict[str, str]) -> list[str]:
    out = list(args)
    for flag, value in flags.items():
        for i, arg in enumerate(out):
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                break
            if arg == flag and i + 1 < len(out):
                out[i + 1] = value
                break
        else:
            out.append(f"{flag}={value}")
    return out


def _message(exc: ApiException) -> str:
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message", exc.reason))
    except ValueError:
        return str(exc.reason)
