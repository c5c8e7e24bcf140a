"""Root-cause evaluation on the Nezha RCA data set (OnlineBoutique), replayed as metric streams.

Nezha (Yu et al., ESEC/FSE 2023) published per-minute pod metrics, call-edge latencies and a call graph
of the OnlineBoutique demo, with a list of injected faults (time, pod, fault type). This module turns
that folder into what ClusterMedic sees live and asks it for the root cause:

1. **Load** (:func:`load_nezha`): any folder in Nezha's layout, i.e. ``<date>-fault_list.json`` files
   somewhere under it and, for each date, a ``.../<name ending in the date>/metric/`` folder with
   ``<pod>_metric.csv`` files; optionally ``source_50.csv`` / ``destination_50.csv`` (median latency of
   each call edge, as the caller and as the callee measured it), ``dependency.csv`` (the call graph)
   and ``root_cause_*.json`` (Nezha's finer, inner-service labels). A wrong layout raises
   :class:`NezhaLayoutError` naming the missing file.
2. **Replay** (:func:`replay_day`): every minute becomes one :class:`MetricBatch` per pod (entity: the
   pod; labels ``pod``, ``service``, ``namespace``) and one per call edge (entity ``caller->callee``;
   labels ``source_service``, ``destination_service``), with the recorded timestamps. Column names
   become Prometheus-style metric names (:data:`POD_METRICS`, :data:`EDGE_METRICS`).
3. **Detect**: the batches go through :class:`evals.detect.OfflineDetect` (the detect role's own
   objects) with :class:`pipelines.detectors.service_metrics.ServiceMetricDetector`, the robust-z
   detector for generic service metrics. The correlation engine is not used: the routing groups alerts
   by node and alert name, which Nezha's data does not carry, and each case is the label's fault
   window anyway (the anomalies from ``inject`` to ``inject + window_s``).
4. **Rank** (:class:`NezhaRanker`): per service, evidence from its anomalies: its own pod's metrics
   and the latency of the calls *into* it. Topology from the call graph: latency evidence of a service
   whose own calls to an anomalous callee are slow is discounted (the slowness is inherited; the deepest
   anomalous service is the likely root), resource evidence (CPU, memory) is not. The fault type comes
   from the runbooks in ``knowledge/runbooks/microservice/``: the cosine, weighted by inverse document
   frequency, between the service's anomalous metrics and each runbook's ``signals.metrics``.
5. **Score** (:func:`evaluate_nezha`, :func:`summarise`): top-1 / top-3 for the root-cause service and
   for the (service, fault type) pair, against Nezha's published figures.

Nothing here is tuned per case: one detector configuration and one ranker for every fault.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.core.errors import ConfigError
from services.core.events import Anomaly, MetricBatch, Sample
from services.diagnostician.runbooks import Runbook, load_runbook

FloatArray = npt.NDArray[np.float64]

PUBLISHED: dict[str, Any] = {
    "system": "Nezha (Yu et al., ESEC/FSE 2023): metrics + logs + traces",
    "cases": 56,
    "level": "service",
    "top1": 0.929,
    "top3": 0.964,
}
NAMESPACE = "hipster"

# Nezha pod-metric columns -> the metric names the replay emits (cAdvisor-style ``container_``/``node_``).
POD_METRICS: dict[str, str] = {
    "CpuUsage(m)": "container_cpu_usage_millicores",
    "CpuUsageRate(%)": "container_cpu_usage_percent",
    "MemoryUsage(Mi)": "container_memory_usage_mebibytes",
    "MemoryUsageRate(%)": "container_memory_usage_percent",
    "SyscallRead": "container_syscalls_read",
    "SyscallWrite": "container_syscalls_write",
    "NetworkReceiveBytes": "container_network_receive_bytes_rate",
    "NetworkTransmitBytes": "container_network_transmit_bytes_rate",
    "PodClientLatencyP90(s)": "container_client_latency_p90_seconds",
    "PodServerLatencyP90(s)": "container_server_latency_p90_seconds",
    "PodClientLatencyP95(s)": "container_client_latency_p95_seconds",
    "PodServerLatencyP95(s)": "container_server_latency_p95_seconds",
    "PodClientLatencyP99(s)": "container_client_latency_p99_seconds",
    "PodServerLatencyP99(s)": "container_server_latency_p99_seconds",
    "PodWorkload(Ops)": "container_workload_ops",
    "PodSuccessRate(%)": "container_success_rate_percent",
    "NodeCpuUsageRate(%)": "node_cpu_usage_percent",
    "NodeMemoryUsageRate(%)": "node_memory_usage_percent",
    "NodeNetworkReceiveBytes": "node_network_receive_bytes_rate",
}
CALLER_LATENCY = "container_call_latency_caller_p50_seconds"
CALLER_SUCCESS = "container_call_success_rate_percent"
CALLEE_LATENCY = "container_call_latency_callee_p50_seconds"
# Call-edge files -> metric: median latency of each edge as its caller / its callee measured it.
EDGE_METRICS: dict[str, str] = {"source_50.csv": CALLER_LATENCY, "destination_50.csv": CALLEE_LATENCY}
# The entry service as its users see it (``front_service.csv``): a call edge from outside, ENTRY_CALLER.
ENTRY_FILE = "front_service.csv"
ENTRY_CALLER = "client"
ENTRY_METRICS: dict[str, str] = {"LatencyP50(s)": CALLER_LATENCY, "SuccessRate(%)": CALLER_SUCCESS}

# The direction in which a change of the metric hurts (+1 up, -1 down); unlisted metrics count either way.
HARMFUL_DIRECTION: dict[str, int] = {
    "container_cpu_usage_millicores": +1,
    "container_cpu_usage_percent": +1,
    "container_memory_usage_mebibytes": +1,
    "container_memory_usage_percent": +1,
    "container_client_latency_p90_seconds": +1,
    "container_server_latency_p90_seconds": +1,
    "container_client_latency_p95_seconds": +1,
    "container_server_latency_p95_seconds": +1,
    "container_client_latency_p99_seconds": +1,
    "container_server_latency_p99_seconds": +1,
    "container_success_rate_percent": -1,
    CALLER_SUCCESS: -1,
    CALLER_LATENCY: +1,
    CALLEE_LATENCY: +1,
}
# Evidence that a service is slow (and may only inherit a callee's slowness), as opposed to resource use.
LATENCY_METRICS: frozenset[str] = frozenset(
    {name for name in HARMFUL_DIRECTION if "latency" in name} | {CALLER_LATENCY, CALLEE_LATENCY}
)
_PERCENTILE = re.compile(r"_p(?:90|95|99)_")
LATENCY_FAMILIES: frozenset[str] = frozenset(_PERCENTILE.sub("_", m) for m in LATENCY_METRICS)
# Node-level metrics describe the node the pod shares with others: not evidence about the service.
NODE_METRICS: frozenset[str] = frozenset(name for name in POD_METRICS.values() if name.startswith("node_"))

# Nezha fault type -> the root cause of the microservice runbook that describes it.
FAULT_CAUSES: dict[str, str] = {
    "cpu_contention": "service_cpu_contention",
    "cpu_consumed": "service_cpu_consumed",
    "network_delay": "service_network_delay",
    "return": "service_wrong_return_value",
    "exception": "service_code_exception",
}
CAUSE_FAULTS: dict[str, str] = {cause: fault for fault, cause in FAULT_CAUSES.items()}

# Latency evidence of a service that calls a slow, anomalous service keeps this share of its weight.
INHERITED_FACTOR = 0.3
# A service's pairs score service_score * (TYPE_FLOOR + type cosine): the service decides first.
TYPE_FLOOR = 0.25

_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})$")
_FAULT_LIST = re.compile(r"^(\d{4}-\d{2}-\d{2})-fault_list\.json$")
_POD_SUFFIX = re.compile(r"^(?P<service>.+?)-[0-9a-f]{5,10}-[0-9a-z]{5}$")


class NezhaLayoutError(ConfigError):
    """The folder is not in Nezha's layout, or a file in it cannot be read."""


# ------------------------------------------------------------------------------------------ loading


@dataclass(frozen=True)
class NezhaFault:
    """One injected fault: the case label.

    Attributes:
        date: the fault list's date (``2022-08-22``).
        inject_ts: injection time, UNIX seconds.
        pod: the pod the fault was injected into.
        service: the pod's service (its deployment name), the service-level label.
        fault_type: ``cpu_contention``, ``cpu_consumed``, ``network_delay``, ``return`` or ``exception``.
        inner_label: Nezha's finer label for this service and fault type (a metric or a code region),
            when the data set has one.
    """

    date: str
    inject_ts: float
    pod: str
    service: str
    fault_type: str
    inner_label: str = ""

    @property
    def case_id(self) -> str:
        """A readable id: date, time and pod."""
        when = datetime.fromtimestamp(self.inject_ts, UTC).strftime("%H:%M:%S")
        return f"{self.date}T{when}/{self.service}/{self.fault_type}"


@dataclass
class NezhaDay:
    """One dated folder of fault-suffering data and the faults injected that day."""

    date: str
    metric_dir: Path
    pod_files: dict[str, Path]
    edge_files: dict[str, Path]
    faults: list[NezhaFault] = field(default_factory=list)
    entry_file: Path | None = None


@dataclass
class NezhaDataset:
    """Everything :func:`load_nezha` found.

    Attributes:
        root: the folder given.
        days: dates with both metrics and a fault list.
        call_graph: caller service -> the services it calls.
        unreplayable: faults whose date has no metric folder (reported, not scored).
    """

    root: Path
    days: list[NezhaDay]
    call_graph: dict[str, set[str]]
    unreplayable: list[NezhaFault] = field(default_factory=list)

    @property
    def services(self) -> set[str]:
        """Every service with pod metrics or in the call graph."""
        out = set(self.call_graph) | {s for callees in self.call_graph.values() for s in callees}
        for day in self.days:
            out.update(service_of(pod) for pod in day.pod_files)
        return out


def metric_family(name: str) -> str:
    """One name for the p90/p95/p99 variants of a metric: they are one signal, counted once."""
    return _PERCENTILE.sub("_", name)


def service_of(pod: str) -> str:
    """The deployment a pod belongs to: ``cartservice-579f59597d-wc2lz`` -> ``cartservice``."""
    match = _POD_SUFFIX.match(pod)
    return match.group("service") if match else pod


def load_nezha(root: Path) -> NezhaDataset:
    """Find the fault lists, the dated metric folders, the call graph and the inner labels under ``root``.

    Raises:
        NezhaLayoutError: ``root`` is missing, has no ``<date>-fault_list.json``, no dated folder with a
            ``metric/`` folder of ``*_metric.csv`` files, or a file is unreadable; the message names it.
    """
    if not root.is_dir():
        raise NezhaLayoutError(f"{root}: Nezha data folder does not exist")
    lists = sorted(p for p in root.rglob("*-fault_list.json") if _FAULT_LIST.match(p.name))
    if not lists:
        raise NezhaLayoutError(
            f"{root}: no <date>-fault_list.json found (Nezha keeps them as rca_data/2022-08-22-fault_list.json)"
        )
    inner = _inner_labels(root)
    metric_dirs = _metric_dirs(root)
    if not metric_dirs:
        raise NezhaLayoutError(
            f"{root}: no <...date>/metric/ folder with <pod>_metric.csv files "
            "(expected e.g. OnlineBoutique_2022-08-22/metric/cartservice-579f59597d-wc2lz_metric.csv)"
        )
    days: list[NezhaDay] = []
    unreplayable: list[NezhaFault] = []
    graph: dict[str, set[str]] = defaultdict(set)
    for path in lists:
        date = _FAULT_LIST.match(path.name).group(1)  # type: ignore[union-attr]  # filtered above
        faults = _read_faults(path, date, inner)
        folder = metric_dirs.get(date)
        if folder is None:
            unreplayable.extend(faults)
            continue
        pods = {p.name[: -len("_metric.csv")]: p for p in sorted(folder.glob("*_metric.csv"))}
        edges = {metric: folder / name for name, metric in EDGE_METRICS.items() if (folder / name).is_file()}
        entry = folder / ENTRY_FILE
        day = NezhaDay(
            date, folder, pods, edges, sorted(faults, key=lambda f: f.inject_ts), entry if entry.is_file() else None
        )
        days.append(day)
        services = {service_of(pod) for pod in pods}
        for caller, callee in _call_edges(folder, services):
            graph[caller].add(callee)
    if not days:
        dates = ", ".join(sorted({f.date for f in unreplayable}))
        raise NezhaLayoutError(f"{root}: fault lists for {dates} but no metric folder for any of those dates")
    return NezhaDataset(root, days, dict(graph), unreplayable)


def _metric_dirs(root: Path) -> dict[str, Path]:
    """Date -> its ``metric/`` folder. Nezha's fault-free ``construct_data`` copies are never chosen."""
    found: dict[str, Path] = {}
    for folder in sorted(root.rglob("metric")):
        match = _DATE.search(folder.parent.name)
        if not folder.is_dir() or match is None or not any(folder.glob("*_metric.csv")):
            continue
        if "construct_data" in folder.parts:
            continue
        found.setdefault(match.group(1), folder)
    return found


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NezhaLayoutError(f"{path}: cannot read JSON: {exc}") from exc


def _inner_labels(root: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("root_cause_*.json")):
        data = _read_json(path)
        if isinstance(data, dict):
            for service, labels in data.items():
                if isinstance(labels, dict):
                    out.setdefault(str(service), {}).update({str(k): str(v) for k, v in labels.items()})
    return out


def _read_faults(path: Path, date: str, inner: Mapping[str, Mapping[str, str]]) -> list[NezhaFault]:
    """Faults of one fault list: ``{"<hour>": [{"inject_timestamp", "inject_pod", "inject_type"}, ...]}``."""
    data = _read_json(path)
    groups = data.values() if isinstance(data, dict) else [data]
    faults: list[NezhaFault] = []
    for group in groups:
        for item in group if isinstance(group, list) else []:
            try:
                pod = str(item["inject_pod"])
                fault_type = str(item["inject_type"])
                ts = float(item["inject_timestamp"])
            except (KeyError, TypeError, ValueError) as exc:
                raise NezhaLayoutError(
                    f"{path}: fault entry {item!r} lacks inject_pod/inject_type/inject_timestamp"
                ) from exc
            service = service_of(pod)
            faults.append(NezhaFault(date, ts, pod, service, fault_type, inner.get(service, {}).get(fault_type, "")))
    return faults


def _call_edges(folder: Path, services: set[str]) -> list[tuple[str, str]]:
    """Service-to-service calls: ``dependency.csv`` rows between known services, else the edge-file headers."""
    dependency = folder / "dependency.csv"
    edges: list[tuple[str, str]] = []
    if dependency.is_file():
        with _open_csv(dependency) as reader:
            for row in reader:
                source, target = row.get("Source", ""), row.get("Target", "")
                if source in services and target in services and source != target:
                    edges.append((source, target))
    if edges:
        return edges
    for name in EDGE_METRICS:
        path = folder / name
        if path.is_file():
            with _open_csv(path) as reader:
                edges.extend(e for column in reader.fieldnames or () if (e := split_edge(column, services)))
    return edges


def split_edge(column: str, services: set[str]) -> tuple[str, str] | None:
    """``frontend_cartservice`` -> ``("frontend", "cartservice")`` when both halves are known services."""
    parts = column.split("_")
    for i in range(1, len(parts)):
        caller, callee = "_".join(parts[:i]), "_".join(parts[i:])
        if caller in services and callee in services:
            return caller, callee
    return None


class _open_csv:
    """``with _open_csv(path) as reader`` -> a DictReader; unreadable files raise NezhaLayoutError."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> csv.DictReader[str]:
        try:
            self.handle = self.path.open(encoding="utf-8", newline="")
        except OSError as exc:
            raise NezhaLayoutError(f"{self.path}: cannot read: {exc}") from exc
        return csv.DictReader(self.handle)

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


@dataclass
class Table:
    """One CSV file as columns: ``timestamps`` (UNIX seconds) and float columns (NaN where empty)."""

    timestamps: FloatArray
    columns: dict[str, FloatArray]
    note: str = ""


def read_table(path: Path) -> Table:
    """Read a Nezha metric CSV.

    The time comes from the ``TimeStamp``/``timestamp`` column, unless it disagrees with the ``Time``
    text by more than five minutes: one published file (adservice, 2022-08-22) has every TimeStamp
    200,000,000 s ahead of its own Time text, so the text wins there and ``note`` says so.

    Raises:
        NezhaLayoutError: the file is unreadable or has no time column.
    """
    with _open_csv(path) as reader:
        rows = list(reader)
        names = list(reader.fieldnames or ())
    stamp = next((n for n in ("TimeStamp", "timestamp") if n in names), None)
    text = next((n for n in ("Time", "time") if n in names), None)
    if stamp is None and text is None:
        raise NezhaLayoutError(f"{path}: no TimeStamp/timestamp or Time column")
    ts = np.array([_float(r.get(stamp, "")) if stamp else math.nan for r in rows], dtype=np.float64)
    note = ""
    if text is not None:
        parsed = np.array([_parse_time(r.get(text, "")) for r in rows], dtype=np.float64)
        off = np.isfinite(parsed) & (~np.isfinite(ts) | (np.abs(ts - parsed) > 300))
        if off.any():
            note = f"{path.name}: {int(off.sum())} rows with a TimeStamp that disagrees with Time; Time used"
            ts = np.where(off, parsed, ts)
    skip = {stamp, text, "PodName", "ServiceName"}
    columns = {n: np.array([_float(r.get(n, "")) for r in rows], dtype=np.float64) for n in names if n not in skip}
    keep = np.isfinite(ts)
    return Table(ts[keep], {n: v[keep] for n, v in columns.items()}, note)


def _float(text: str | None) -> float:
    if not text:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def _parse_time(text: str | None) -> float:
    """``2022-08-22 03:51:19.607 +0000 UTC m=+0.11`` -> UNIX seconds (the first 19 characters, UTC)."""
    try:
        return datetime.strptime((text or "")[:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return math.nan


# ------------------------------------------------------------------------------------------- replay


def replay_day(
    day: NezhaDay, services: set[str], notes: list[str] | None = None
) -> Iterator[tuple[float, list[MetricBatch]]]:
    """Yield ``(minute, batches)`` in time order: one batch per pod and per call edge with data that minute.

    Args:
        day: the dated folder.
        services: known services (to split edge column names).
        notes: data-quality remarks are appended here (e.g. timestamps repaired).
    """
    by_minute: dict[int, list[MetricBatch]] = defaultdict(list)
    for pod, path in day.pod_files.items():
        table = read_table(path)
        if table.note and notes is not None:
            notes.append(table.note)
        labels = {"pod": pod, "service": service_of(pod), "namespace": NAMESPACE}
        for i, ts in enumerate(table.timestamps):
            samples = tuple(
                Sample(name=metric, labels=labels, value=float(table.columns[column][i]), ts=float(ts))
                for column, metric in POD_METRICS.items()
                if column in table.columns and math.isfinite(table.columns[column][i])
            )
            if samples:
                by_minute[int(ts // 60)].append(MetricBatch(entity=pod, source="nezha", samples=samples))
    edge_samples: dict[tuple[int, str], list[Sample]] = defaultdict(list)
    for metric, path in day.edge_files.items():
        table = read_table(path)
        if table.note and notes is not None:
            notes.append(table.note)
        for column, values in table.columns.items():
            edge = split_edge(column, services)
            if edge is None:
                continue
            labels = {"source_service": edge[0], "destination_service": edge[1], "namespace": NAMESPACE}
            for ts, value in zip(table.timestamps, values, strict=True):
                if math.isfinite(value):
                    sample = Sample(name=metric, labels=labels, value=float(value), ts=float(ts))
                    edge_samples[(int(ts // 60), f"{edge[0]}->{edge[1]}")].append(sample)
    if day.entry_file is not None:
        table = read_table(day.entry_file)
        entry = _entry_service(day.entry_file, services)
        labels = {"source_service": ENTRY_CALLER, "destination_service": entry, "namespace": NAMESPACE}
        for column, metric in ENTRY_METRICS.items():
            for ts, value in zip(table.timestamps, table.columns.get(column, ()), strict=False):
                if math.isfinite(value):
                    sample = Sample(name=metric, labels=labels, value=float(value), ts=float(ts))
                    edge_samples[(int(ts // 60), f"{ENTRY_CALLER}->{entry}")].append(sample)
    for (minute, entity), edge_batch in edge_samples.items():
        by_minute[minute].append(MetricBatch(entity=entity, source="nezha", samples=tuple(edge_batch)))
    for minute in sorted(by_minute):
        yield minute * 60.0, by_minute[minute]


def _entry_service(path: Path, services: set[str]) -> str:
    """The service ``front_service.csv`` describes (its ServiceName, matched case-insensitively)."""
    with _open_csv(path) as reader:
        first = next(iter(reader), {})
    name = str(first.get("ServiceName") or "frontend")
    return next((s for s in services if s.lower() == name.lower()), name.lower())


@dataclass
class DetectedDay:
    """The anomalies of one replayed day and the time span the replay covered."""

    anomalies: list[Anomaly]
    first_ts: float
    last_ts: float


def detect_day(day: NezhaDay, services: set[str], notes: list[str] | None = None) -> DetectedDay:
    """Replay one day through :class:`evals.detect.OfflineDetect` and collect every anomaly."""
    from evals.detect import OfflineDetect
    from pipelines.detect import DetectorSet
    from pipelines.detectors.service_metrics import ServiceMetricDetector

    offline = OfflineDetect(DetectorSet.of([ServiceMetricDetector()]))
    anomalies: list[Anomaly] = []
    first, last = math.inf, -math.inf
    for minute, batches in replay_day(day, services, notes):
        first, last = min(first, minute), max(last, minute + 60.0)
        anomalies.extend(offline.feed(batches))
    return DetectedDay(anomalies, first, last)


# ------------------------------------------------------------------------------------------ ranking


def microservice_runbooks(knowledge_dir: Path) -> list[Runbook]:
    """The runbooks of ``<knowledge>/runbooks/microservice/`` whose root cause is a Nezha fault type's.

    Raises:
        ConfigError: the folder is missing, a runbook is invalid, or a fault type has no runbook.
    """
    folder = knowledge_dir / "runbooks" / "microservice"
    runbooks = [load_runbook(path) for path in sorted(folder.glob("*.md"))]
    missing = sorted(set(FAULT_CAUSES.values()) - {rb.root_cause for rb in runbooks})
    if missing:
        raise ConfigError(f"{folder}: no runbook for the root causes {', '.join(missing)}")
    return [rb for rb in runbooks if rb.root_cause in CAUSE_FAULTS]


@dataclass
class Candidate:
    """One ranked root-cause candidate: a service and a fault type."""

    service: str
    fault_type: str
    score: float
    service_score: float
    type_score: float
    evidence: list[str] = field(default_factory=list)


@dataclass
class ServiceEvidence:
    """What the anomalies of one case say about one service."""

    own: dict[str, float] = field(default_factory=dict)  # pod metric family -> strongest anomaly strength
    inbound: dict[str, float] = field(default_factory=dict)  # "caller:metric family" -> strength, calls into it
    slow_callees: set[str] = field(default_factory=set)  # callees this service's calls to are slow

    @property
    def metrics(self) -> set[str]:
        """The metric names with anomalies, own or on calls into the service."""
        return set(self.own) | {key.split(":", 1)[1] for key in self.inbound}


class NezhaRanker:
    """Ranks (service, fault type) root-cause candidates from a case's anomalies.

    Args:
        call_graph: caller -> callees.
        runbooks: the microservice runbooks (one per fault type).
    """

    def __init__(self, call_graph: Mapping[str, set[str]], runbooks: Sequence[Runbook]) -> None:
        self.call_graph = {caller: set(callees) for caller, callees in call_graph.items()}
        self.signatures = {
            CAUSE_FAULTS[rb.root_cause]: {metric_family(m) for m in rb.signals.metrics} for rb in runbooks
        }
        # inverse document frequency over the runbooks, as the offline ranker weighs its features
        counts: dict[str, int] = defaultdict(int)
        for families in self.signatures.values():
            for family in families:
                counts[family] += 1
        self.idf = {family: math.log(1.0 + len(self.signatures) / n) for family, n in counts.items()}

    def evidence(self, anomalies: Sequence[Anomaly]) -> dict[str, ServiceEvidence]:
        """Attribute every firing anomaly in the harmful direction to the service it is about."""
        out: dict[str, ServiceEvidence] = defaultdict(ServiceEvidence)
        for anomaly in anomalies:
            name = str(anomaly.evidence.get("metric", ""))
            if anomaly.status != "firing" or not name or name in NODE_METRICS:
                continue
            harmful = HARMFUL_DIRECTION.get(name, 0)
            direction = +1 if anomaly.evidence.get("direction") == "up" else -1
            if harmful and harmful != direction:
                continue
            metric = metric_family(name)
            strength = 1.0 + math.log(max(anomaly.score, anomaly.threshold) / anomaly.threshold)
            callee = anomaly.labels.get("destination_service")
            if callee:
                caller = anomaly.labels.get("source_service", "")
                key = f"{caller}:{metric}"
                out[callee].inbound[key] = max(out[callee].inbound.get(key, 0.0), strength)
                if caller:
                    out[caller].slow_callees.add(callee)
            elif anomaly.labels.get("service"):
                ev = out[anomaly.labels["service"]]
                ev.own[metric] = max(ev.own.get(metric, 0.0), strength)
        return dict(out)

    def service_score(self, service: str, evidence: Mapping[str, ServiceEvidence]) -> float:
        """Resource evidence plus latency evidence, the latter discounted when a callee explains it."""
        ev = evidence[service]
        inherited = any(
            callee in self.call_graph.get(service, set()) and _has_evidence(evidence.get(callee))
            for callee in ev.slow_callees
        )
        factor = INHERITED_FACTOR if inherited else 1.0
        score = sum(v * (factor if m in LATENCY_FAMILIES else 1.0) for m, v in ev.own.items())
        score += sum(v * (factor if k.split(":", 1)[1] in LATENCY_FAMILIES else 1.0) for k, v in ev.inbound.items())
        return score

    def type_scores(self, metrics: set[str]) -> dict[str, float]:
        """Fault type -> IDF-weighted cosine between the anomalous metric families and the runbook's."""
        weight = self.idf
        ev_norm = math.sqrt(sum(weight.get(m, 0.0) ** 2 for m in metrics))
        out: dict[str, float] = {}
        for fault_type, listed in self.signatures.items():
            rb_norm = math.sqrt(sum(weight.get(m, 0.0) ** 2 for m in listed))
            top = sum(weight.get(m, 0.0) ** 2 for m in listed & metrics)
            out[fault_type] = top / (rb_norm * ev_norm) if top and rb_norm and ev_norm else 0.0
        return out

    def rank(self, anomalies: Sequence[Anomaly]) -> list[Candidate]:
        """Candidates best first; services without evidence are not candidates."""
        evidence = self.evidence(anomalies)
        candidates: list[Candidate] = []
        for service in sorted(evidence):
            score = self.service_score(service, evidence)
            if score <= 0:
                continue
            ev = evidence[service]
            cited = [f"{m} on {service}" for m in sorted(ev.own)] + [
                f"{k.split(':', 1)[1]} of calls from {k.split(':', 1)[0]}" for k in sorted(ev.inbound)
            ]
            for fault_type, type_score in self.type_scores(ev.metrics).items():
                candidates.append(
                    Candidate(service, fault_type, score * (TYPE_FLOOR + type_score), score, type_score, cited)
                )
        candidates.sort(key=lambda c: (-c.score, -c.service_score, c.service, c.fault_type))
        return candidates


def _has_evidence(ev: ServiceEvidence | None) -> bool:
    return ev is not None and bool(ev.own or ev.inbound)


def ranked_services(candidates: Sequence[Candidate]) -> list[str]:
    """Services in the order of their best candidate."""
    return list(dict.fromkeys(c.service for c in candidates))


# --------------------------------------------------------------------------------------- evaluation


@dataclass
class NezhaCaseResult:
    """One fault and what the ranker made of its window."""

    fault: NezhaFault
    anomalies: int
    services: list[str]
    pairs: list[tuple[str, str]]
    latency_ms: float

    def service_hit(self, k: int) -> bool:
        """The injected service ranks within the top ``k`` services."""
        return self.fault.service in self.services[:k]

    def pair_hit(self, k: int) -> bool:
        """The injected (service, fault type) ranks within the top ``k`` candidates."""
        return (self.fault.service, self.fault.fault_type) in self.pairs[:k]


@dataclass
class NezhaReport:
    """The results of one evaluation run."""

    root: Path
    cases: list[NezhaCaseResult]
    unreplayable: list[NezhaFault]
    outside_data: list[NezhaFault]
    notes: list[str]
    replay_s: float


def evaluate_nezha(root: Path, knowledge_dir: Path, *, window_s: float = 300.0) -> NezhaReport:
    """Replay every day of a Nezha folder, rank each fault's window and score it against the label.

    Args:
        root: a Nezha-layout folder (see :func:`load_nezha`).
        knowledge_dir: the knowledge folder holding ``runbooks/microservice/``.
        window_s: how long after the injection the anomalies belong to the case.

    Raises:
        NezhaLayoutError: the folder is not in Nezha's layout.
        ConfigError: the microservice runbooks are missing or invalid.
    """
    dataset = load_nezha(root)
    ranker = NezhaRanker(dataset.call_graph, microservice_runbooks(knowledge_dir))
    services = dataset.services
    notes: list[str] = []
    cases: list[NezhaCaseResult] = []
    outside: list[NezhaFault] = []
    started = time.perf_counter()
    for day in dataset.days:
        detected = detect_day(day, services, notes)
        for fault in day.faults:
            if not detected.first_ts <= fault.inject_ts <= detected.last_ts:
                outside.append(fault)
                continue
            window = [a for a in detected.anomalies if fault.inject_ts <= a.ts <= fault.inject_ts + window_s]
            t0 = time.perf_counter()
            candidates = ranker.rank(window)
            latency_ms = (time.perf_counter() - t0) * 1000
            pairs = [(c.service, c.fault_type) for c in candidates]
            cases.append(NezhaCaseResult(fault, len(window), ranked_services(candidates), pairs, latency_ms))
    return NezhaReport(root, cases, dataset.unreplayable, outside, notes, time.perf_counter() - started)


def summarise(report: NezhaReport) -> dict[str, Any]:
    """Top-1 / top-3 (service, and service + fault type), per fault type, latency and the published figures."""
    cases = report.cases
    n = len(cases)

    def share(hits: int) -> float | None:
        return round(hits / n, 4) if n else None

    latencies = sorted(c.latency_ms for c in cases)

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None

    by_type: dict[str, dict[str, Any]] = {}
    for fault_type in sorted({c.fault.fault_type for c in cases}):
        rs = [c for c in cases if c.fault.fault_type == fault_type]
        by_type[fault_type] = {
            "cases": len(rs),
            "service_top1": sum(c.service_hit(1) for c in rs),
            "service_top3": sum(c.service_hit(3) for c in rs),
            "pair_top1": sum(c.pair_hit(1) for c in rs),
            "pair_top3": sum(c.pair_hit(3) for c in rs),
        }
    return {
        "data": str(report.root),
        "cases_labelled": n + len(report.unreplayable) + len(report.outside_data),
        "cases_evaluated": n,
        "cases_without_metrics": len(report.unreplayable),
        "cases_outside_metric_range": len(report.outside_data),
        "service_top1": share(sum(c.service_hit(1) for c in cases)),
        "service_top3": share(sum(c.service_hit(3) for c in cases)),
        "service_and_type_top1": share(sum(c.pair_hit(1) for c in cases)),
        "service_and_type_top3": share(sum(c.pair_hit(3) for c in cases)),
        "published": PUBLISHED,
        # ranking one case's window; replay and detection are in replay_and_detect_s
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "mean": round(statistics.fmean(latencies), 3) if n else None},
        "replay_and_detect_s": round(report.replay_s, 2),
        "by_fault_type": by_type,
        "cases": [
            {
                "case": c.fault.case_id,
                "anomalies": c.anomalies,
                "top3": [f"{s}/{t}" for s, t in c.pairs[:3]],
                "service_rank": c.services.index(c.fault.service) + 1 if c.fault.service in c.services else None,
            }
            for c in cases
        ],
        "notes": sorted(set(report.notes)),
    }


def format_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table of the headline figures against Nezha's."""
    pub = summary["published"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:5.1f}%"

    lines = [
        f"Nezha RCA replay: {summary['cases_evaluated']} cases evaluated "
        f"({summary['cases_without_metrics']} without metrics, {summary['cases_outside_metric_range']} outside them)",
        f"{'':28}{'top-1':>8}{'top-3':>8}",
        f"{'ClusterMedic service':28}{pct(summary['service_top1']):>8}{pct(summary['service_top3']):>8}",
        f"{'ClusterMedic service+type':28}"
        f"{pct(summary['service_and_type_top1']):>8}{pct(summary['service_and_type_top3']):>8}",
        f"{'Nezha published (service)':28}{pct(pub['top1']):>8}{pct(pub['top3']):>8}",
        f"ranking latency p50 {summary['latency_ms']['p50']} ms, p99 {summary['latency_ms']['p99']} ms",
        f"{'fault type':16}{'cases':>6}{'svc@1':>7}{'svc@3':>7}{'pair@1':>8}{'pair@3':>8}",
    ]
    for fault_type, row in summary["by_fault_type"].items():
        lines.append(
            f"{fault_type:16}{row['cases']:>6}{row['service_top1']:>7}{row['service_top3']:>7}"
            f"{row['pair_top1']:>8}{row['pair_top3']:>8}"
        )
    return "\n".join(lines)
