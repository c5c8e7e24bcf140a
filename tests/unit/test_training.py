"""Baselines for training: windows judged normal, time ranges, and the fast decode of the detect agent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.detect import decode_metric_batch
from pipelines.training import Exclusions, TimeRange, exclusions_from, parse_instant, vectors_from_batches
from services.core.errors import ConfigError
from services.core.events import AlertRef, Anomaly, IncidentEvent, MetricBatch, Sample


def _gpu(uuid: str, ts: float, util: float = 50.0, node: str = "n1") -> MetricBatch:
    labels = {"UUID": uuid, "Hostname": node, "pod": f"pod-{uuid}"}
    return MetricBatch(
        entity=uuid,
        samples=(
            Sample(name="DCGM_FI_DEV_GPU_UTIL", labels=labels, value=util, ts=ts),
            Sample(name="DCGM_FI_DEV_GPU_TEMP", labels=labels, value=60, ts=ts),
        ),
    )


def _scrapes(uuid: str, count: int, node: str = "n1") -> list[MetricBatch]:
    return [_gpu(uuid, 15.0 * i, node=node) for i in range(count)]  # 15 s apart from t = 0


def test_without_exclusions_every_scrape_after_the_first_is_a_row() -> None:
    baseline = vectors_from_batches(_scrapes("GPU-a", 10) + _scrapes("GPU-b", 10))
    assert baseline.scrapes == 18 and baseline.samples == 40
    assert {k: len(v) for k, v in baseline.series["gpu"].items()} == {"GPU-a": 9, "GPU-b": 9}
    assert baseline.excluded_windows == 0


def test_a_window_touched_by_an_anomaly_is_left_out_whole_and_splits_the_series() -> None:
    # windows of 60 s: scrapes at 15..45 (first window), 60..105, 120..165; anomaly at 70 s on GPU-a
    exclusions = Exclusions({"GPU-a": [(70.0, 70.0)]}, window_s=60)
    baseline = vectors_from_batches(_scrapes("GPU-a", 12) + _scrapes("GPU-b", 12), exclusions)
    series = baseline.series["gpu"]
    assert len(series["GPU-a"]) == 3  # 15, 30, 45
    assert len(series["GPU-a#1"]) == 4  # 120..165, after the left-out window 60..105
    assert len(series["GPU-b"]) == 11  # another GPU keeps everything
    assert baseline.excluded_vectors == 4 and baseline.excluded_windows == 1
    assert baseline.entities("gpu") == 2


def test_an_anomaly_about_the_node_or_the_pod_leaves_out_the_gpu_windows_too() -> None:
    by_node = vectors_from_batches(_scrapes("GPU-a", 5, node="n7"), Exclusions({"n7": [(0.0, 1e9)]}))
    by_pod = vectors_from_batches(_scrapes("GPU-a", 5), Exclusions({"pod-GPU-a": [(0.0, 1e9)]}))
    elsewhere = vectors_from_batches(_scrapes("GPU-a", 5), Exclusions({"n9": [(0.0, 1e9)]}))
    assert by_node.scrapes == 0 and by_pod.scrapes == 0
    assert elsewhere.scrapes == 4


def test_time_range_and_instants() -> None:
    now = 1_800_000_000.0
    assert parse_instant("now", now) == now
    assert parse_instant("2h", now) == now - 7200
    assert parse_instant("1764000000", now) == 1_764_000_000.0
    assert parse_instant("2026-11-29T21:00:00", now) == datetime(2026, 11, 29, 21, tzinfo=UTC).timestamp()
    with pytest.raises(ConfigError):
        parse_instant("yesterday-ish", now)
    with pytest.raises(ConfigError):
        TimeRange(now, now - 1)
    described = TimeRange(0, 3600).describe()
    assert described["since_iso"] == "1970-01-01T00:00:00+00:00" and described["until"] == 3600


def test_fast_decode_accepts_valid_batches_and_leaves_bad_ones_to_the_dead_letter_path() -> None:
    batch = _gpu("GPU-a", 1.0)
    assert decode_metric_batch(batch.to_bytes()) == batch
    assert decode_metric_batch(b"{broken") is None
    assert decode_metric_batch(b'{"entity": "x", "samples": "nope"}') is None
    assert decode_metric_batch(b"[]") is None
    assert decode_metric_batch(None) is None


def test_anomalies_and_incidents_cover_their_stretches_widened_by_the_margin() -> None:
    def anomaly(entity: str, ts: float, status: str = "firing", **labels: str) -> Anomaly:
        return Anomaly(
            entity=entity,
            signal="s",
            detector="d",
            score=1,
            threshold=1,
            ts=ts,
            status=status,  # type: ignore[arg-type]
            labels=labels,
            fingerprint=f"fp-{entity}",
        )

    incident = IncidentEvent(
        incident_id="i1",
        kind="opened",
        severity="warning",
        title="t",
        opened_at=500,
        ts=700,
        alerts=(
            AlertRef(fingerprint="f", entity="pod-x", signal="s", detector="d", severity="warning", starts_at=500),
        ),
    )
    found = exclusions_from(
        [anomaly("GPU-a", 100, gpu="GPU-a", pod="pod-a"), anomaly("GPU-a", 400, status="resolved")],
        [incident],
        margin_s=10,
        window_s=60,
    )
    assert found.intervals["GPU-a"] == [(90, 110), (90, 410)]  # firing at 100 .. resolved at 400
    assert found.intervals["pod-a"] == [(90, 110)]
    assert found.intervals["pod-x"] == [(490, 710)]
    assert found.window_s == 60
