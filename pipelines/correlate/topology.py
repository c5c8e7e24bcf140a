"""Topology correlation: which alerts sit on one GPU -> node -> pod -> model path.

Every alert is *anchored* at the entity it is about (its ``entity_kind``; for ``other`` and
``service`` the most specific topology label it carries). Labels name the entities around it:

=============  ==============================================================================
level          labels read (first present wins; ``entity`` when the kind says so)
=============  ==============================================================================
gpu            ``UUID``, ``uuid``, ``gpu_uuid``; else ``gpu`` (an index is qualified by the node)
node           ``node``, ``Hostname``, ``hostname``, ``kubernetes_node``, ``nodename``
pod            ``pod`` (namespace is not part of a pod's identity here: names carry a hash)
model          ``model_name``, ``model`` -> ``model:<name>``; ``deployment``, ``app`` -> ``deploy:<name>``
=============  ==============================================================================

Each label set the engine sees teaches *facts*: GPU g is on node n, pod p runs on node n, pod p
uses GPU g, pod p serves model/deployment m, model m and deployment d are one thing. Two anchors
are related when

* some chain (g, n, p, m) built from those facts contains both: a GPU and a pod on its node, a
  node and a model one of whose pods runs there, and so on; or
* both are GPUs or pods on the same node (a node is one failure domain); or
* both are pods serving the same model or deployment (a bad rollout crashes every replica).

Two GPUs on different nodes, or two models, are not related directly, even when one model is
served on both: they meet only through an alert on something they share.

Facts are kept with the time they were last seen and forgotten after ``fact_ttl``; a pod that moves
to another node keeps only its newest node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

LEVELS: tuple[str, ...] = ("gpu", "node", "pod", "model")
_KIND_LEVEL: dict[str, str] = {"gpu": "gpu", "node": "node", "pod": "pod", "model": "model"}
GPU_LABELS = ("UUID", "uuid", "gpu_uuid")
NODE_LABELS = ("node", "Hostname", "hostname", "kubernetes_node", "nodename")
MODEL_LABELS = ("model_name", "model")
DEPLOYMENT_LABELS = ("deployment", "app")

Tokens = dict[str, set[str]]


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    for name in names:
        value = labels.get(name, "")
        if value:
            return value
    return ""


def tokens(labels: Mapping[str, str], entity: str = "", entity_kind: str = "other") -> Tokens:
    """The topology entities a label set names, per level, as ``level:name`` tokens."""
    out: Tokens = {level: set() for level in LEVELS}
    node = entity if entity_kind == "node" else _first(labels, NODE_LABELS)
    if node:
        out["node"].add(f"node:{node}")
    gpu = entity if entity_kind == "gpu" else _first(labels, GPU_LABELS)
    if not gpu and labels.get("gpu"):
        index = labels["gpu"]
        gpu = f"{node}/{index}" if index.isdigit() and node else index
    if gpu:
        out["gpu"].add(f"gpu:{gpu}")
    pod = entity if entity_kind == "pod" else labels.get("pod", "")
    if pod:
        out["pod"].add(f"pod:{pod.rsplit('/', 1)[-1]}")
    if entity_kind == "model":
        out["model"].add(f"model:{entity}")
    for name in MODEL_LABELS:
        if labels.get(name):
            out["model"].add(f"model:{labels[name]}")
    for name in DEPLOYMENT_LABELS:
        if labels.get(name):
            out["model"].add(f"deploy:{labels[name]}")
    return out


def anchor(labels: Mapping[str, str], entity: str, entity_kind: str) -> tuple[str, frozenset[str]]:
    """The level and tokens an alert is about.

    An alert whose kind is not a topology level (``other``, ``service``) is anchored at the most
    specific topology label it has, or at ``other:<entity>`` when it has none, which relates only
    to alerts about the very same entity.
    """
    found = tokens(labels, entity, entity_kind)
    level = _KIND_LEVEL.get(entity_kind)
    if level is None:
        level = next((lv for lv in LEVELS if found[lv]), "")
    if not level or not found[level]:
        return "other", frozenset({f"other:{entity}"})
    return level, frozenset(found[level])


class Topology:
    """Facts learned from label sets, and the relation they define between anchors."""

    def __init__(self) -> None:
        # Each map: key -> [value, last_seen]; edges are "a|b" -> last_seen.
        self.gpu_node: dict[str, list[Any]] = {}
        self.pod_node: dict[str, list[Any]] = {}
        self.gpu_pod: dict[str, float] = {}
        self.pod_model: dict[str, float] = {}
        self.alias: dict[str, float] = {}

    def learn(self, labels: Mapping[str, str], now: float, entity: str = "", entity_kind: str = "other") -> None:
        """Record the facts one label set states."""
        found = tokens(labels, entity, entity_kind)
        nodes = sorted(found["node"])
        if len(nodes) == 1:
            for gpu in found["gpu"]:
                self.gpu_node[gpu] = [nodes[0], now]
            for pod in found["pod"]:
                self.pod_node[pod] = [nodes[0], now]
        for gpu in found["gpu"]:
            for pod in found["pod"]:
                self.gpu_pod[f"{gpu}|{pod}"] = now
        for pod in found["pod"]:
            for model in found["model"]:
                self.pod_model[f"{pod}|{model}"] = now
        models = sorted(found["model"])
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                self.alias[f"{a}|{b}"] = now

    def forget(self, now: float, ttl: float) -> None:
        """Drop facts not seen for ``ttl`` seconds."""
        self.gpu_node = {k: v for k, v in self.gpu_node.items() if now - v[1] < ttl}
        self.pod_node = {k: v for k, v in self.pod_node.items() if now - v[1] < ttl}
        self.gpu_pod = {k: t for k, t in self.gpu_pod.items() if now - t < ttl}
        self.pod_model = {k: t for k, t in self.pod_model.items() if now - t < ttl}
        self.alias = {k: t for k, t in self.alias.items() if now - t < ttl}

    # ---------------------------------------------------------------------------------- queries

    @staticmethod
    def _pairs(edges: Mapping[str, float]) -> list[tuple[str, str]]:
        return [(a, b) for a, _, b in (k.partition("|") for k in edges)]

    def _pods_on(self, nodes: set[str]) -> set[str]:
        return {pod for pod, (node, _) in self.pod_node.items() if node in nodes}

    def _gpus_on(self, nodes: set[str]) -> set[str]:
        return {gpu for gpu, (node, _) in self.gpu_node.items() if node in nodes}

    def _models_of(self, pods: set[str]) -> set[str]:
        return {m for p, m in self._pairs(self.pod_model) if p in pods}

    def reach(self, level: str, anchor_tokens: Iterable[str]) -> set[str]:
        """Every token that shares a GPU -> node -> pod -> model chain with one of ``anchor_tokens``."""
        start = set(anchor_tokens)
        out = set(start)
        gpu_pod = self._pairs(self.gpu_pod)
        if level == "gpu":
            nodes = {self.gpu_node[g][0] for g in start if g in self.gpu_node}
            pods = self._pods_on(nodes) | {p for g, p in gpu_pod if g in start}
            out |= nodes | pods | self._models_of(pods)
        elif level == "node":
            pods = self._pods_on(start)
            out |= self._gpus_on(start) | pods | self._models_of(pods)
        elif level == "pod":
            nodes = {self.pod_node[p][0] for p in start if p in self.pod_node}
            gpus = self._gpus_on(nodes) | {g for g, p in gpu_pod if p in start}
            out |= nodes | gpus | self._models_of(start)
        elif level == "model":
            models = set(start)
            for a, b in self._pairs(self.alias):
                if a in start:
                    models.add(b)
                if b in start:
                    models.add(a)
            pods = {p for p, m in self._pairs(self.pod_model) if m in models}
            nodes = {self.pod_node[p][0] for p in pods if p in self.pod_node}
            gpus = self._gpus_on(nodes) | {g for g, p in gpu_pod if p in pods}
            out |= models | pods | nodes | gpus
        return out

    def _nodes_of(self, level: str, anchor_tokens: Iterable[str]) -> set[str]:
        table = self.gpu_node if level == "gpu" else self.pod_node if level == "pod" else {}
        return {table[t][0] for t in anchor_tokens if t in table}

    def related(self, a: tuple[str, frozenset[str]], b: tuple[str, frozenset[str]]) -> bool:
        """Whether two anchors belong to one failure domain.

        True when they lie on one GPU -> node -> pod -> model chain; when both are GPUs or pods on
        the same node (one node is one failure domain); or when both are pods serving the same
        model or deployment (a bad rollout crashes every replica). Anchors at the ``other`` level
        relate only to the very same entity.
        """
        if a == b:
            return True
        if a[0] == "other" or b[0] == "other":
            return False
        if self.reach(a[0], a[1]) & b[1]:
            return True
        if {a[0], b[0]} <= {"gpu", "pod"} and self._nodes_of(a[0], a[1]) & self._nodes_of(b[0], b[1]):
            return True
        return a[0] == b[0] == "pod" and bool(self._models_of(set(a[1])) & self._models_of(set(b[1])))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "gpu_node": {k: list(v) for k, v in sorted(self.gpu_node.items())},
            "pod_node": {k: list(v) for k, v in sorted(self.pod_node.items())},
            "gpu_pod": dict(sorted(self.gpu_pod.items())),
            "pod_model": dict(sorted(self.pod_model.items())),
            "alias": dict(sorted(self.alias.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Inverse of :meth:`to_dict`."""
        topo = cls()
        topo.gpu_node = {k: [v[0], float(v[1])] for k, v in data.get("gpu_node", {}).items()}
        topo.pod_node = {k: [v[0], float(v[1])] for k, v in data.get("pod_node", {}).items()}
        topo.gpu_pod = {k: float(t) for k, t in data.get("gpu_pod", {}).items()}
        topo.pod_model = {k: float(t) for k, t in data.get("pod_model", {}).items()}
        topo.alias = {k: float(t) for k, t in data.get("alias", {}).items()}
        return topo
