"""Nezha RCA replay: the loader, the metric-stream replay, the robust-z detector and the root-cause ranking.

The tests build a small Nezha-layout folder of their own (three services in a chain, two injected
faults); the published OnlineBoutique and TrainTicket data from ../shared/data is the data tier's
(tests/data/test_nezha_published.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from evals import nezha
from evals.nezha import (
    CALLEE_LATENCY,
    CALLER_LATENCY,
    NezhaLayoutError,
    NezhaRanker,
    evaluate_nezha,
    load_nezha,
    microservice_runbooks,
    read_table,
    replay_day,
    service_of,
    summarise,
)
from pipelines.detectors.episodes import EpisodePolicy
from pipelines.detectors.service_metrics import ServiceMetricDetector, ServiceMetricState
from services.core.events import Anomaly, MetricBatch, Sample
from services.core.paths import REPO_ROOT

KNOWLEDGE = REPO_ROOT / "knowledge"
START = datetime(2030, 1, 1, 0, 0, 19, tzinfo=UTC).timestamp()
MINUTES = 120
PODS = {
    "frontend": "frontend-5f6585d649-abcde",
    "backend": "backend-579f59597d-wc2lz",
    "database": "database-668d5f85fb-wckp8",
}
POD_COLUMNS = (
    "CpuUsage(m)",
    "CpuUsageRate(%)",
    "MemoryUsage(Mi)",
    "MemoryUsageRate(%)",
    "SyscallRead",
    "SyscallWrite",
    "NetworkReceiveBytes",
    "NetworkTransmitBytes",
    "PodClientLatencyP90(s)",
    "PodServerLatencyP90(s)",
    "PodClientLatencyP95(s)",
    "PodServerLatencyP95(s)",
    "PodClientLatencyP99(s)",
    "PodServerLatencyP99(s)",
    "PodWorkload(Ops)",
    "PodSuccessRate(%)",
    "NodeCpuUsageRate(%)",
    "NodeMemoryUsageRate(%)",
    "NodeNetworkReceiveBytes",
)
BASE = {
    "CpuUsage(m)": 5.0,
    "CpuUsageRate(%)": 25.0,
    "MemoryUsage(Mi)": 100.0,
    "MemoryUsageRate(%)": 40.0,
    "SyscallRead": 1000.0,
    "SyscallWrite": 900.0,
    "NetworkReceiveBytes": 30000.0,
    "NetworkTransmitBytes": 60000.0,
    "PodClientLatencyP90(s)": 0.05,
    "PodServerLatencyP90(s)": 0.1,
    "PodClientLatencyP95(s)": 0.06,
    "PodServerLatencyP95(s)": 0.12,
    "PodClientLatencyP99(s)": 0.08,
    "PodServerLatencyP99(s)": 0.15,
    "PodWorkload(Ops)": 9.0,
    "PodSuccessRate(%)": 100.0,
    "NodeCpuUsageRate(%)": 10.0,
    "NodeMemoryUsageRate(%)": 30.0,
    "NodeNetworkReceiveBytes": 50000.0,
}
EDGES = ("frontend_backend", "backend_database")
CPU_FAULT_MINUTE = 60  # database: cpu_contention
NET_FAULT_MINUTE = 90  # backend: network_delay
FAULT_MINUTES = 5


def _time_text(ts: float, offset: float) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp}.573905004 +0000 UTC m=+{offset:.6f}"


def _during(minute: int, start: int) -> bool:
    return start <= minute < start + FAULT_MINUTES


def _pod_row(service: str, minute: int, rng: np.random.Generator) -> dict[str, float]:
    """One minute of one pod: noisy baselines, plus what each injected fault does to it."""
    row = {c: BASE[c] * (1.0 + rng.normal(0.0, 0.02)) for c in POD_COLUMNS}
    row["PodSuccessRate(%)"] = 100.0
    if _during(minute, CPU_FAULT_MINUTE):
        if service == "database":  # a stressor in the pod: CPU and memory up, serving slower
            for c in ("CpuUsage(m)", "CpuUsageRate(%)"):
                row[c] *= 4.0
            for c in ("MemoryUsage(Mi)", "MemoryUsageRate(%)"):
                row[c] *= 1.5
            for c in POD_COLUMNS:
                if c.startswith("PodServerLatency"):
                    row[c] *= 5.0
        else:  # callers inherit the slowness
            for c in POD_COLUMNS:
                if c.startswith(("PodServerLatency", "PodClientLatency")):
                    row[c] *= 3.0
    if _during(minute, NET_FAULT_MINUTE):
        if service == "backend":  # its packets are delayed: its own calls out are slow
            for c in POD_COLUMNS:
                if c.startswith("PodClientLatency"):
                    row[c] *= 20.0
        elif service == "frontend":
            for c in POD_COLUMNS:
                if c.startswith(("PodServerLatency", "PodClientLatency")):
                    row[c] *= 3.0
    return row


def _edge_value(edge: str, side: str, minute: int, rng: np.random.Generator) -> float:
    value = 0.004 * (1.0 + rng.normal(0.0, 0.02))
    if _during(minute, CPU_FAULT_MINUTE):
        value *= 20.0 if edge == "backend_database" else 5.0
    if _during(minute, NET_FAULT_MINUTE) and edge == "frontend_backend" and side == "source":
        value *= 50.0  # only the caller sees the network delay
    return value


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _fault(minute: int, pod: str, fault_type: str) -> dict[str, str]:
    ts = START + 60 * minute - 10
    return {
        "inject_time": datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "inject_timestamp": str(int(ts)),
        "inject_pod": pod,
        "inject_type": fault_type,
    }


def make_nezha(root: Path, *, with_second_day_labels: bool = True) -> Path:
    """Write a Nezha-layout folder: one day of metrics for a three-service chain and two faults."""
    rng = np.random.default_rng(7)
    metric = root / "Shop_2030-01-01" / "metric"
    metric.mkdir(parents=True)
    for service, pod in PODS.items():
        rows: list[list[object]] = []
        for minute in range(MINUTES):
            ts = START + 60 * minute
            values = _pod_row(service, minute, rng)
            rows.append([_time_text(ts, 60.0 * minute), int(ts), pod, *(values[c] for c in POD_COLUMNS)])
        _write_csv(metric / f"{pod}_metric.csv", ["Time", "TimeStamp", "PodName", *POD_COLUMNS], rows)
    for name, side in (("source_50.csv", "source"), ("destination_50.csv", "destination")):
        rows = []
        for minute in range(MINUTES):
            ts = START + 60 * minute + 1
            rows.append([_time_text(ts, 60.0 * minute), int(ts), *(_edge_value(e, side, minute, rng) for e in EDGES)])
        _write_csv(metric / name, ["time", "timestamp", *EDGES], rows)
    _write_csv(
        metric / "dependency.csv",
        ["Source", "Target", "Weight"],
        [["frontend", "backend", 1], ["backend", "database", 1], ["database", "10.0.0.7", 1]],
    )
    labels = root / "labels"
    labels.mkdir()
    faults = {
        "01": [_fault(CPU_FAULT_MINUTE, PODS["database"], "cpu_contention")],
        "02": [_fault(NET_FAULT_MINUTE, PODS["backend"], "network_delay")],
    }
    (labels / "2030-01-01-fault_list.json").write_text(json.dumps(faults), encoding="utf-8")
    if with_second_day_labels:  # a day whose metrics were not published
        later = {"05": [_fault(MINUTES + 24 * 60, PODS["backend"], "exception")]}
        (labels / "2030-01-02-fault_list.json").write_text(json.dumps(later), encoding="utf-8")
    inner = {"database": {"cpu_contention": "CpuUsageRate(%)"}}
    (labels / "root_cause_shop_inner_service.json").write_text(json.dumps(inner), encoding="utf-8")
    return root


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return make_nezha(tmp_path / "nezha")


# ------------------------------------------------------------------------------------------- loading


def test_loader_finds_the_day_the_faults_the_call_graph_and_the_inner_labels(shop: Path) -> None:
    data = load_nezha(shop)
    assert [d.date for d in data.days] == ["2030-01-01"]
    day = data.days[0]
    assert set(day.pod_files) == set(PODS.values())
    assert set(day.edge_files) == {CALLER_LATENCY, CALLEE_LATENCY}
    assert data.call_graph == {"frontend": {"backend"}, "backend": {"database"}}  # IP targets dropped
    assert [(f.service, f.fault_type) for f in day.faults] == [
        ("database", "cpu_contention"),
        ("backend", "network_delay"),
    ]
    assert day.faults[0].inner_label == "CpuUsageRate(%)"
    assert [(f.date, f.fault_type) for f in data.unreplayable] == [("2030-01-02", "exception")]


def test_service_of_strips_the_replica_set_hash_and_pod_suffix() -> None:
    assert service_of("productcatalogservice-668d5f85fb-wckp8") == "productcatalogservice"
    assert service_of("redis-cart") == "redis-cart"


def test_a_folder_without_fault_lists_is_rejected_naming_the_file(tmp_path: Path) -> None:
    root = make_nezha(tmp_path / "nezha")
    for path in (root / "labels").glob("*-fault_list.json"):
        path.unlink()
    with pytest.raises(NezhaLayoutError, match=r"fault_list\.json"):
        load_nezha(root)


def test_a_folder_without_metric_csvs_is_rejected_naming_what_is_expected(tmp_path: Path) -> None:
    root = make_nezha(tmp_path / "nezha")
    for path in (root / "Shop_2030-01-01" / "metric").glob("*_metric.csv"):
        path.unlink()
    with pytest.raises(NezhaLayoutError, match=r"_metric\.csv"):
        load_nezha(root)


def test_a_missing_folder_and_a_broken_fault_entry_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(NezhaLayoutError, match="does not exist"):
        load_nezha(tmp_path / "absent")
    root = make_nezha(tmp_path / "nezha")
    (root / "labels" / "2030-01-01-fault_list.json").write_text('{"01": [{"inject_pod": "x"}]}', encoding="utf-8")
    with pytest.raises(NezhaLayoutError, match="inject_type"):
        load_nezha(root)


def test_a_timestamp_that_disagrees_with_the_time_text_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "adservice-5f6585d649-fnmft_metric.csv"
    ts = int(START)
    _write_csv(
        path,
        ["Time", "TimeStamp", "PodName", "CpuUsageRate(%)"],
        [
            [_time_text(ts, 0.0), ts + 200_000_000, "adservice-5f6585d649-fnmft", 5.0],
            [_time_text(ts + 60, 60.0), ts + 60, "adservice-5f6585d649-fnmft", ""],
        ],
    )
    table = read_table(path)
    assert table.timestamps.tolist() == [ts, ts + 60]
    assert "1 rows" in table.note
    assert np.isnan(table.columns["CpuUsageRate(%)"][1])


# -------------------------------------------------------------------------------------------- replay


def test_replay_emits_one_batch_per_pod_and_edge_each_minute_in_time_order(shop: Path) -> None:
    data = load_nezha(shop)
    steps = list(replay_day(data.days[0], data.services))
    assert len(steps) == MINUTES
    assert [t for t, _ in steps] == sorted(t for t, _ in steps)
    first_t, first = steps[0]
    entities = {b.entity for b in first}
    assert entities == set(PODS.values()) | {"frontend->backend", "backend->database"}
    pod = next(b for b in first if b.entity == PODS["database"])
    cpu = next(s for s in pod.samples if s.name == "container_cpu_usage_percent")
    assert cpu.labels == {"pod": PODS["database"], "service": "database", "namespace": "hipster"}
    assert cpu.ts == START
    edge = next(b for b in first if b.entity == "backend->database")
    assert {s.name for s in edge.samples} == {CALLER_LATENCY, CALLEE_LATENCY}
    assert edge.samples[0].labels["destination_service"] == "database"
    assert all(first_t <= s.ts < first_t + 60 for b in first for s in b.samples)


# ------------------------------------------------------------------------------------------ detector


def _batch(value: float, ts: float, name: str = "container_cpu_usage_percent") -> MetricBatch:
    sample = Sample(name=name, labels={"pod": "p-1", "service": "p"}, value=value, ts=ts)
    return MetricBatch(entity="p-1", samples=(sample,))


def test_detector_raises_one_anomaly_per_spike_and_none_for_noise() -> None:
    detector = ServiceMetricDetector(episodes=EpisodePolicy(warmup=10, persistence=1, rearm=2))
    rng = np.random.default_rng(1)
    state = detector.initial_state()
    found: list[Anomaly] = []
    values = [25.0 + rng.normal(0.0, 0.5) for _ in range(80)]
    values[40:44] = [80.0, 82.0, 81.0, 79.0]  # one episode, four samples long
    for i, value in enumerate(values):
        state, anomalies = detector.detect([_batch(value, 60.0 * i)], state)
        found.extend(anomalies)
    assert [a.ts for a in found] == [60.0 * 40]
    anomaly = found[0]
    assert anomaly.entity_kind == "pod" and anomaly.signal == "metric_outlier"
    assert anomaly.evidence["metrics"] == {"container_cpu_usage_percent": 80.0}
    assert anomaly.evidence["direction"] == "up" and anomaly.score > anomaly.threshold


def test_detector_state_round_trips_and_scores_identically() -> None:
    detector = ServiceMetricDetector()
    state = detector.initial_state()
    for i in range(30):
        state, _ = detector.detect([_batch(10.0 + (i % 3), 60.0 * i)], state)
    restored = ServiceMetricState.from_dict(json.loads(json.dumps(state.to_dict())))
    _, direct = detector.detect([_batch(50.0, 1800.0)], state)
    _, again = detector.detect([_batch(50.0, 1800.0)], restored)
    assert [a.score for a in direct] == [a.score for a in again] and direct


# ------------------------------------------------------------------------------------------- ranking


def test_microservice_runbooks_cover_every_nezha_fault_type() -> None:
    runbooks = microservice_runbooks(KNOWLEDGE)
    assert {nezha.CAUSE_FAULTS[rb.root_cause] for rb in runbooks} == set(nezha.FAULT_CAUSES)
    assert all(rb.area == "microservice" for rb in runbooks)


def _anomaly(entity: str, metric: str, labels: dict[str, str], score: float = 30.0) -> Anomaly:
    return Anomaly(
        entity=entity,
        signal="metric_outlier",
        detector="service_metrics",
        score=score,
        threshold=6.0,
        ts=0.0,
        labels=labels,
        evidence={"metric": metric, "direction": "up", "metrics": {metric: 1.0}},
    )


def test_ranker_prefers_the_deepest_anomalous_service_over_callers_that_inherit_its_latency() -> None:
    ranker = NezhaRanker({"frontend": {"backend"}, "backend": {"database"}}, microservice_runbooks(KNOWLEDGE))
    backend = {"pod": "backend-1", "service": "backend"}
    anomalies = [
        # backend looks worse on its own (3 x 100 > 2 x 30) but its calls into database are slow too
        _anomaly("backend-1", "container_server_latency_p90_seconds", backend, score=100.0),
        _anomaly("backend-1", "container_client_latency_p90_seconds", backend, score=100.0),
        _anomaly("f->b", CALLER_LATENCY, {"source_service": "frontend", "destination_service": "backend"}, 100.0),
        _anomaly("b->d", CALLER_LATENCY, {"source_service": "backend", "destination_service": "database"}),
        _anomaly("b->d", CALLEE_LATENCY, {"source_service": "backend", "destination_service": "database"}),
    ]
    ranked = nezha.ranked_services(ranker.rank(anomalies))
    assert ranked[:2] == ["database", "backend"]


def test_ranker_ignores_changes_in_the_harmless_direction() -> None:
    ranker = NezhaRanker({}, microservice_runbooks(KNOWLEDGE))
    faster = _anomaly("db-1", "container_server_latency_p90_seconds", {"pod": "db-1", "service": "db"})
    faster = faster.model_copy(update={"evidence": {**faster.evidence, "direction": "down"}})
    assert ranker.rank([faster]) == []


def test_replayed_faults_rank_the_injected_service_and_fault_type_first(shop: Path) -> None:
    report = evaluate_nezha(shop, KNOWLEDGE)
    by_type = {c.fault.fault_type: c for c in report.cases}
    assert by_type["cpu_contention"].pairs[0] == ("database", "cpu_contention")
    assert by_type["network_delay"].pairs[0] == ("backend", "network_delay")
    summary = summarise(report)
    assert summary["cases_evaluated"] == 2 and summary["cases_without_metrics"] == 1
    assert summary["service_top1"] == 1.0 and summary["service_and_type_top1"] == 1.0
    assert summary["published"]["top1"] == 0.929 and summary["published"]["top3"] == 0.964
    assert set(summary["latency_ms"]) >= {"p50", "p99"}


def test_cli_prints_the_table_and_the_json(shop: Path) -> None:
    from services.cli import app

    result = CliRunner().invoke(app, ["eval", "diagnose", "--nezha", str(shop)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["service_top1"] == 1.0
    assert "Nezha published (service)" in result.stderr


def test_cli_says_what_is_wrong_with_a_folder_that_is_not_nezha(tmp_path: Path) -> None:
    from services.cli import app

    result = CliRunner().invoke(app, ["eval", "diagnose", "--nezha", str(tmp_path)])
    assert result.exit_code == 1
    assert "fault_list.json" in result.stderr
