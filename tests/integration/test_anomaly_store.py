"""The anomaly history: the store functions on the real PostgreSQL, and the correlate role writing it
through the real broker for the diagnostician's evidence tools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest

from pipelines.app import create_pipeline
from pipelines.correlate.agent import CorrelateOptions, PostgresCorrelateStore, register_correlate
from pipelines.correlate.history import alert_fingerprint
from services.alerting.config import loads_routing
from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import Anomaly, DeadLetter, IncidentEvent, Provenance
from services.core.settings import Settings
from services.diagnostician.tools import gather_evidence
from services.store.anomalies import list_anomalies, prune_anomalies, write_anomalies
from services.store.db import connect, migrate

pytestmark = pytest.mark.integration

DCGM = Provenance(source="dcgm", stream="dcgm-exporter", trusted=("gpu_fault", "topology"))
# One incident per signal and node (topology correlation off), so that a neighbour's anomaly on the
# same node stays out of the GPU's incident and can only be found through the anomalies table.
ROUTING = """
route: {receiver: sre, group_by: [alertname, node], group_wait: 1s, group_interval: 1m}
receivers: [{name: sre}]
correlation: {topology: {enabled: false}}
"""


def anomaly(entity: str, signal: str, ts: float, **fields: Any) -> Anomaly:
    values: dict[str, Any] = {
        "entity": entity,
        "entity_kind": "gpu",
        "signal": signal,
        "detector": "xid_rules",
        "score": 79.0,
        "threshold": 1.0,
        "severity": "critical",
        "ts": ts,
        "labels": {"node": "node-h1", "gpu": entity},
        "provenance": DCGM,
    }
    values.update(fields)
    found = Anomaly(**values)
    return found.model_copy(update={"fingerprint": alert_fingerprint(found)})


# ------------------------------------------------------------------------------ store functions


def test_a_batch_is_upserted_once_whatever_the_redeliveries(fresh_database: Settings) -> None:
    migrate(fresh_database)
    now = time.time()
    first = [anomaly("GPU-1", "gpu_xid", now + i) for i in range(3)]
    with connect(fresh_database) as conn:
        assert write_anomalies(conn, first) == []
        # a redelivered batch, a duplicate inside one batch, and the resolution of the last occurrence
        resolved = first[2].model_copy(update={"status": "resolved"})
        assert write_anomalies(conn, [*first, first[0], resolved]) == []
        rows = list_anomalies(conn, fingerprint=first[0].fingerprint)

    assert len(rows) == 3
    assert [r.status for r in rows] == ["resolved", "firing", "firing"]  # newest first
    assert rows[0].provenance["source"] == "dcgm" and rows[0].provenance["trusted"] == ["gpu_fault", "topology"]
    assert rows[1].labels == {"node": "node-h1", "gpu": "GPU-1"}


def test_evidence_is_capped_and_text_postgres_refuses_is_cleaned(fresh_database: Settings) -> None:
    migrate(fresh_database)
    big = anomaly(
        "GPU-2",
        "gpu_xid",
        time.time(),
        evidence={"xid": 79, "reason": "fell off the bus", "window": list(range(5000)), "line": "NVRM\x00 Xid"},
        labels={"node": "node-h1", "gpu": "GPU-2", "pod": "a\x00b"},
    )
    nan = anomaly("GPU-3", "gpu_xid", time.time(), evidence={"value": float("nan"), "inf": float("inf")})
    with connect(fresh_database) as conn:
        assert write_anomalies(conn, [big, nan], max_evidence_bytes=1024) == []
        (stored,) = list_anomalies(conn, entity="GPU-2")
        (cleaned,) = list_anomalies(conn, entity="GPU-3")
        size = conn.execute("SELECT max(octet_length(evidence::text)) FROM anomalies").fetchone()

    assert stored.evidence == {"xid": 79, "reason": "fell off the bus", "line": "NVRM Xid", "_dropped": ["window"]}
    assert stored.labels["pod"] == "ab"
    assert cleaned.evidence == {"value": None, "inf": None}
    assert size is not None and size[0] <= 1024


def test_unstorable_anomalies_are_returned_and_the_rest_written(fresh_database: Settings) -> None:
    migrate(fresh_database)
    good = anomaly("GPU-4", "gpu_xid", time.time())
    far = anomaly("GPU-5", "gpu_xid", 1e15)  # beyond any calendar
    nameless = Anomaly(entity="GPU-6", signal="gpu_xid", detector="xid_rules", score=1, threshold=1, ts=time.time())
    with connect(fresh_database) as conn:
        rejected = write_anomalies(conn, [far, good, nameless])
        stored = list_anomalies(conn)

    assert [(a.entity, "out of range" in why or "fingerprint" in why) for a, why in rejected] == [
        ("GPU-5", True),
        ("GPU-6", True),
    ]
    assert [r.entity for r in stored] == ["GPU-4"]


def test_prune_deletes_only_what_is_older_than_the_horizon(fresh_database: Settings) -> None:
    migrate(fresh_database)
    t0 = 1_800_000_000.0
    with connect(fresh_database) as conn:
        write_anomalies(conn, [anomaly("GPU-7", "gpu_xid", t0 + i * 3600) for i in range(5)])
        deleted = prune_anomalies(conn, older_than=t0 + 2 * 3600)
        left = [r.ts.timestamp() for r in list_anomalies(conn)]

    assert deleted == 2
    assert left == [t0 + 4 * 3600, t0 + 3 * 3600, t0 + 2 * 3600]


# -------------------------------------------------------------------- through the correlate role


class FlakyStore(PostgresCorrelateStore):
    """The real store, whose first anomaly writes fail as a database outage would."""

    def __init__(self, settings: Settings, failures: int) -> None:
        super().__init__(settings)
        self.failures = failures

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        if self.failures > 0:
            self.failures -= 1
            raise psycopg.OperationalError("connection refused (simulated outage)")
        return super().save_anomalies(anomalies)


async def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll a blocking ``check`` (in a thread) until it is truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


def test_the_evidence_tools_find_what_the_correlate_role_stored(
    kafka_ready: None, fresh_database: Settings, settings: Settings
) -> None:
    settings = fresh_database.model_copy(update={"topic_prefix": settings.topic_prefix})
    migrate(settings)
    ensure_topics(settings)
    now = time.time()
    xids = [anomaly("GPU-h1-0", "gpu_xid", now + i, evidence={"xid": 79}) for i in range(3)]
    neighbour = anomaly("GPU-h1-1", "ecc_sbe_rate", now + 1, severity="warning")
    rollout = anomaly(
        "pod-llama-7f9c-x2",
        "latency_regression",
        now + 2,
        entity_kind="pod",
        detector="latency",
        severity="warning",
        labels={"node": "node-h2", "pod": "pod-llama-7f9c-x2"},
        evidence={"reason": "Rollout"},
        provenance=Provenance(source="prometheus", stream="vllm", trusted=("topology",)),
    )
    # the producer leaves the fingerprint empty (detect does): the role stores the alert's
    published = [a.model_copy(update={"fingerprint": ""}) for a in [*xids, xids[0], neighbour, rollout]]

    def gpu_incident() -> IncidentEvent | None:
        for _, _, raw in read_raw(settings, [IncidentEvent.topic], max_messages=1000, timeout_s=1):
            event = IncidentEvent.from_bytes(raw)
            if any(a.entity == "GPU-h1-0" for a in event.alerts):
                return event
        return None

    def evidence(incident: IncidentEvent) -> dict[str, Any] | None:
        with connect(settings) as conn:
            results = gather_evidence(incident, conn).results
        history = results["incident_anomalies"].data[0].get("history")
        return {name: r.data for name, r in results.items()} if history and history["occurrences"] == 3 else None

    async def run() -> dict[str, Any]:
        pipeline = create_pipeline(settings)
        store = FlakyStore(settings, failures=2)
        register_correlate(
            pipeline,
            loads_routing(ROUTING),
            notify=lambda _: None,
            store=store,
            options=CorrelateOptions(tick_s=0.3, checkpoint_s=0.5, retry_max_s=0.5),
        )
        await pipeline.app.start()
        try:
            with KafkaPublisher(settings) as publisher:
                for item in published:
                    publisher.publish(item)
            incident = await wait_for(gpu_incident, 60, "the GPU's incident on incidents.v1")
            found = await wait_for(lambda: evidence(incident), 60, "the GPU's three occurrences in the history")
        finally:
            await pipeline.app.stop()
        assert store.failures == 0, "the simulated outage never happened"
        return found

    found = asyncio.run(run())

    (gpu,) = [a for a in found["incident_anomalies"] if a["entity"] == "GPU-h1-0"]
    assert gpu["history"]["occurrences"] == 3  # three anomalies, one redelivered: counted once
    assert found["topology"]["neighbour_anomalies"] == [
        {"entity": "GPU-h1-1", "signal": "ecc_sbe_rate", "source": "dcgm"}
    ]
    changes = [c for c in found["recent_changes"] if c["entity"] == "pod-llama-7f9c-x2"]
    assert [(c["signal"], c["reason"], c["source"]) for c in changes] == [
        ("latency_regression", "Rollout", "prometheus")
    ]
    with connect(settings) as conn:
        assert len(list_anomalies(conn)) == 5  # every anomaly, once, after the outage
    letters = [
        DeadLetter.from_bytes(v) for _, _, v in read_raw(settings, [DeadLetter.topic], max_messages=100, timeout_s=1)
    ]
    assert letters == []
