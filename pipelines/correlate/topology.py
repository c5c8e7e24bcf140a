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

**PCI addresses.** A node's kernel log names a GPU by PCI bus id only (``NVRM: Xid (PCI:0000:3b:00):
48``). The topology also keeps, per node, which GPU sits at which PCI address, learned from the
``pci_bus_id`` label of a trusted GPU source (DCGM exporter, NVML reader) by :meth:`Topology.learn_pci`,
never by :meth:`Topology.learn` (which reads every alert's labels, a webhook's too). Addresses are
compared as :func:`~services.core.pci.pci_bus_key` keys, and :meth:`Topology.gpu_by_pci` answers which
GPU an alert that names a node and an address (label ``pci_bus_id``, or the log detector's evidence
``pci``) is about. A new GPU at the same address (a replaced board) replaces the old one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any

from services.core.pci import pci_bus_key

LEVELS: tuple[str, ...] = ("gpu", "node", "pod", "model")
_KIND_LEVEL: dict[str, str] = {"gpu": "gpu", "node": "node", "pod": "pod", "model": "model"}
GPU_LABELS = ("UUID", "uuid", "gpu_uuid")
NODE_LABELS = ("node", "Hostname", "hostname", "kubernetes_node", "nodename")
MODEL_LABELS = ("model_name", "model")
DEPLOYMENT_LABELS = ("deployment", "app")
PCI_LABEL = "pci_bus_id"
"""DCGM exporter's (and the NVML reader's) label for a GPU's PCI bus id."""
PCI_EVIDENCE = "pci"
"""The log detector's evidence key for the PCI bus id of a kernel ``NVRM: Xid (PCI:...)`` line."""

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


def _revisions(pods: Iterable[str]) -> set[str]:
    """The revision of each pod token: its name without the last ``-`` part (a Deployment's pod is
    ``<deployment>-<ReplicaSet hash>-<suffix>``; a StatefulSet's ``<name>-<ordinal>`` gives its name)."""
    return {pod.rpartition("-")[0] or pod for pod in pods}


class Topology:
    """Facts learned from label sets, and the relation they define between anchors.

    The fact tables (``gpu_node`` ... ``alias``, ``gpu_pci``) are the state (:meth:`to_dict`). Beside them the
    object keeps derived adjacency indexes and an expiry heap, so that :meth:`reach` and
    :meth:`forget` cost what they touch rather than a pass over every fact (the engine asks on
    every anomaly). They are rebuilt from the tables by :meth:`from_dict` and never serialised.
    """

    def __init__(self) -> None:
        # Each map: key -> [value, last_seen]; edges are "a|b" -> last_seen.
        self.gpu_node: dict[str, list[Any]] = {}
        self.pod_node: dict[str, list[Any]] = {}
        self.gpu_pod: dict[str, float] = {}
        self.pod_model: dict[str, float] = {}
        self.alias: dict[str, float] = {}
        # "node:<n>|pci:<key>" -> [gpu token, last_seen]: which GPU is at a PCI address of a node.
        self.gpu_pci: dict[str, list[Any]] = {}
        # Derived indexes (token -> neighbours), kept in step with the tables above.
        self._node_gpus: dict[str, set[str]] = {}
        self._node_pods: dict[str, set[str]] = {}
        self._gpu_pods: dict[str, set[str]] = {}
        self._pod_gpus: dict[str, set[str]] = {}
        self._pod_models: dict[str, set[str]] = {}
        self._model_pods: dict[str, set[str]] = {}
        self._alias_adj: dict[str, set[str]] = {}
        # (last_seen, table, key) per write; an entry is stale once the fact was seen again (its
        # time differs) or dropped, and is skipped then (lazy invalidation).
        self._expiry: list[tuple[float, str, str]] = []

    # ------------------------------------------------------------------------ derived indexes

    @staticmethod
    def _link(index: dict[str, set[str]], key: str, value: str) -> None:
        index.setdefault(key, set()).add(value)

    @staticmethod
    def _unlink(index: dict[str, set[str]], key: str, value: str) -> None:
        values = index.get(key)
        if values is not None:
            values.discard(value)
            if not values:
                del index[key]

    def _index(self, table: str, key: str, add: bool) -> None:
        """Add (or remove) one fact of ``table`` to (from) the adjacency indexes."""
        if table == "gpu_pci":
            return  # looked up by its key alone
        op = self._link if add else self._unlink
        if table == "gpu_node":
            op(self._node_gpus, self.gpu_node[key][0], key)
        elif table == "pod_node":
            op(self._node_pods, self.pod_node[key][0], key)
        else:
            # Split on the first "|" (as the pairs always were), so odd names pair the same way.
            a, _, b = key.partition("|")
            if table == "gpu_pod":
                op(self._gpu_pods, a, b)
                op(self._pod_gpus, b, a)
            elif table == "pod_model":
                op(self._pod_models, a, b)
                op(self._model_pods, b, a)
            else:
                op(self._alias_adj, a, b)
                op(self._alias_adj, b, a)

    def _table(self, table: str) -> dict[str, Any]:
        return getattr(self, table)

    def _seen(self, table: str, key: str) -> float:
        value = self._table(table)[key]
        return float(value[1]) if isinstance(value, list) else float(value)

    def _put(self, table: str, key: str, value: Any, now: float) -> None:
        """Write one fact (replacing an older one under the same key) and keep the indexes in step."""
        facts = self._table(table)
        if key in facts:
            if self._seen(table, key) > now:
                # a late observation (an old sample, a redelivery) must neither replace a newer fact
                # (the pod has moved since) nor move its clock back (it would expire too early)
                return
            self._index(table, key, add=False)
        facts[key] = value
        self._index(table, key, add=True)
        heapq.heappush(self._expiry, (now, table, key))

    def _rebuild(self) -> None:
        for table in ("gpu_node", "pod_node", "gpu_pod", "pod_model", "alias", "gpu_pci"):
            for key in self._table(table):
                self._index(table, key, add=True)
                heapq.heappush(self._expiry, (self._seen(table, key), table, key))

    # ---------------------------------------------------------------------------------- facts

    def learn(self, labels: Mapping[str, str], now: float, entity: str = "", entity_kind: str = "other") -> None:
        """Record the facts one label set states."""
        found = tokens(labels, entity, entity_kind)
        nodes = sorted(found["node"])
        if len(nodes) == 1:
            for gpu in found["gpu"]:
                self._put("gpu_node", gpu, [nodes[0], now], now)
            for pod in found["pod"]:
                self._put("pod_node", pod, [nodes[0], now], now)
        for gpu in found["gpu"]:
            for pod in found["pod"]:
                self._put("gpu_pod", f"{gpu}|{pod}", now, now)
        for pod in found["pod"]:
            for model in found["model"]:
                self._put("pod_model", f"{pod}|{model}", now, now)
        models = sorted(found["model"])
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                self._put("alias", f"{a}|{b}", now, now)

    def learn_pci(self, labels: Mapping[str, str], now: float, entity: str = "", entity_kind: str = "other") -> None:
        """Record which GPU (by UUID) is at which PCI address of its node, when ``labels`` state it.

        Call it only for label sets of a source trusted for GPU facts (a DCGM or NVML sample or
        anomaly): the mapping decides which GPU a kernel XID is about, and so which GPU a playbook
        acts on.
        """
        key = pci_bus_key(labels.get(PCI_LABEL, ""))
        gpu = entity if entity_kind == "gpu" else _first(labels, GPU_LABELS)
        nodes = tokens(labels, entity, entity_kind)["node"]
        if key and gpu and len(nodes) == 1:
            self._put("gpu_pci", f"{next(iter(nodes))}|pci:{key}", [f"gpu:{gpu}", now], now)

    def forget(self, now: float, ttl: float) -> None:
        """Drop facts not seen for ``ttl`` seconds.

        Pops the expiry heap while its oldest entry is expired (``now - seen >= ttl``, the same test
        as a full pass; it is monotone in ``seen``, so the heap order finds every expired fact).
        """
        while self._expiry and now - self._expiry[0][0] >= ttl:
            seen, table, key = heapq.heappop(self._expiry)
            facts = self._table(table)
            if key in facts and self._seen(table, key) == seen:
                self._index(table, key, add=False)
                del facts[key]

    # ---------------------------------------------------------------------------------- queries

    @staticmethod
    def _union(index: Mapping[str, set[str]], keys: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for key in keys:
            out |= index.get(key, set())
        return out

    def _pods_on(self, nodes: set[str]) -> set[str]:
        return self._union(self._node_pods, nodes)

    def _gpus_on(self, nodes: set[str]) -> set[str]:
        return self._union(self._node_gpus, nodes)

    def _models_of(self, pods: set[str]) -> set[str]:
        return self._union(self._pod_models, pods)

    def reach(self, level: str, anchor_tokens: Iterable[str], neighbours: bool = True) -> set[str]:
        """Every token that shares a GPU -> node -> pod -> model chain with one of ``anchor_tokens``.

        With ``neighbours`` (the default) a GPU or pod also reaches everything on its node; without,
        a pod reaches only the GPUs it uses and a GPU only the pods using it (a node still reaches
        everything on it: it is their common parent).
        """
        start = set(anchor_tokens)
        out = set(start)
        if level == "gpu":
            nodes = {self.gpu_node[g][0] for g in start if g in self.gpu_node}
            pods = self._union(self._gpu_pods, start) | (self._pods_on(nodes) if neighbours else set())
            out |= nodes | pods | self._models_of(pods)
        elif level == "node":
            pods = self._pods_on(start)
            out |= self._gpus_on(start) | pods | self._models_of(pods)
        elif level == "pod":
            nodes = {self.pod_node[p][0] for p in start if p in self.pod_node}
            gpus = self._union(self._pod_gpus, start) | (self._gpus_on(nodes) if neighbours else set())
            out |= nodes | gpus | self._models_of(start)
        elif level == "model":
            models = start | self._union(self._alias_adj, start)
            pods = self._union(self._model_pods, models)
            nodes = {self.pod_node[p][0] for p in pods if p in self.pod_node}
            gpus = self._union(self._pod_gpus, pods) | (self._gpus_on(nodes) if neighbours else set())
            out |= models | pods | nodes | gpus
        return out

    def neighbourhood(self, a: tuple[str, frozenset[str]]) -> set[str]:
        """A superset of the tokens of every anchor ``b`` with ``related(a, b)``.

        Lets the engine look up candidate incidents by token instead of testing every one;
        it still confirms each candidate with :meth:`related`.
        """
        out = set(a[1])
        if a[0] == "other":
            return out
        out |= self.reach(a[0], a[1])
        if a[0] in ("gpu", "pod"):
            nodes = self._nodes_of(a[0], a[1])
            out |= self._gpus_on(nodes) | self._pods_on(nodes)
        if a[0] == "pod":
            out |= self._union(self._model_pods, self._models_of(set(a[1])))
        return out

    def gpu_by_pci(
        self, labels: Mapping[str, str], evidence: Mapping[str, Any], entity: str = "", entity_kind: str = "other"
    ) -> str:
        """The UUID of the GPU an alert names only by node and PCI address, or ``""``.

        The address is the ``pci_bus_id`` label or the log detector's ``pci`` evidence; the node is
        the alert's entity (kind ``node``) or its node label. An alert that names a GPU already (its
        kind, a UUID or index label) gets ``""``: it is anchored at that GPU as it is.
        """
        found = tokens(labels, entity, entity_kind)
        if found["gpu"] or len(found["node"]) != 1:
            return ""
        key = pci_bus_key(str(labels.get(PCI_LABEL) or evidence.get(PCI_EVIDENCE) or ""))
        fact = self.gpu_pci.get(f"{next(iter(found['node']))}|pci:{key}") if key else None
        return str(fact[0]).partition(":")[2] if fact else ""

    def _nodes_of(self, level: str, anchor_tokens: Iterable[str]) -> set[str]:
        table = self.gpu_node if level == "gpu" else self.pod_node if level == "pod" else {}
        return {table[t][0] for t in anchor_tokens if t in table}

    def related(self, a: tuple[str, frozenset[str]], b: tuple[str, frozenset[str]], neighbours: bool = True) -> bool:
        """Whether two anchors belong to one failure domain.

        True when they lie on one GPU -> node -> pod -> model chain; when both are GPUs or pods on
        the same node (one node is one failure domain: *neighbours*); or when both are pods serving
        the same model or deployment (*siblings*: a bad config crashes every replica). Neighbours share
        a cause only when they fail together, so they are left out when ``neighbours`` is False (the
        engine passes it for young incidents only); so are siblings of different revisions (pod names
        ``<deployment>-<ReplicaSet hash>-<suffix>``): a new revision's pods are a change, and their
        failure a new fault, not the old one's. Anchors at the ``other`` level relate only to the
        very same entity.
        """
        if a == b:
            return True
        if a[0] == "other" or b[0] == "other":
            return False
        if self.reach(a[0], a[1], neighbours) & b[1]:
            return True
        if neighbours and {a[0], b[0]} <= {"gpu", "pod"} and self._nodes_of(a[0], a[1]) & self._nodes_of(b[0], b[1]):
            return True
        if a[0] == b[0] == "pod" and self._models_of(set(a[1])) & self._models_of(set(b[1])):
            return neighbours or bool(_revisions(a[1]) & _revisions(b[1]))
        return False

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "gpu_node": {k: list(v) for k, v in sorted(self.gpu_node.items())},
            "pod_node": {k: list(v) for k, v in sorted(self.pod_node.items())},
            "gpu_pod": dict(sorted(self.gpu_pod.items())),
            "pod_model": dict(sorted(self.pod_model.items())),
            "alias": dict(sorted(self.alias.items())),
            "gpu_pci": {k: list(v) for k, v in sorted(self.gpu_pci.items())},
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
        topo.gpu_pci = {k: [v[0], float(v[1])] for k, v in data.get("gpu_pci", {}).items()}
        topo._rebuild()
        return topo
