"""Event-time clocks never run backwards: a late (old) event cannot move a timer back.

The other half, that one far-future event cannot leap a clock, is ingest's bound
(tests/unit/test_ingest_time_bounds.py): such an event never reaches the pipeline.
"""

from __future__ import annotations

from pipelines.correlate.engine import Engine
from pipelines.correlate.topology import Topology, anchor
from pipelines.detect import merge_learned
from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.core.events import Anomaly

CONFIG = """
route:
  receiver: sre
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 4h
receivers:
  - name: sre
    webhook_configs: [{url: "http://hooks.local/sre"}]
correlation:
  flap_detection: {enabled: false}
"""


def _anomaly(signal: str, entity: str, ts: float, detector: str = "rules") -> Anomaly:
    return Anomaly(
        entity=entity,
        entity_kind="gpu",
        signal=signal,
        detector=detector,
        score=2.0,
        threshold=1.0,
        severity="warning",
        ts=ts,
        labels={"node": "node-1"},
        fingerprint=f"{detector}/{signal}/{entity}",
    )


def test_the_correlate_engine_clock_is_not_moved_back_by_a_late_anomaly_or_an_old_tick() -> None:
    engine = Engine(loads_routing(CONFIG))
    engine.ingest(_anomaly("gpu_hot", "GPU-1", 1000.0), 1000.0)
    assert engine.tick(500.0) == [] and engine.clock == 1000.0
    # an anomaly stamped long before is taken at the engine's time (as Alertmanager does, an alert
    # that started longer than group_wait ago is notified at once: at 1000, not at 10)
    late = [a for a in engine.ingest(_anomaly("ecc_sbe", "GPU-2", 10.0), 10.0) if isinstance(a, Notification)]
    assert [(n.group_labels["alertname"], n.ts) for n in late] == [("ecc_sbe", 1000.0)]
    assert engine.clock == 1000.0
    flushed = [a for a in engine.tick(1030.0) if isinstance(a, Notification)]
    assert [(n.group_labels["alertname"], n.ts) for n in flushed] == [("gpu_hot", 1030.0)]


def test_a_late_topology_observation_neither_replaces_a_newer_fact_nor_ages_it() -> None:
    topology = Topology()
    topology.learn({"pod": "vllm-0", "node": "node-2"}, 1000.0)  # the pod moved to node-2
    topology.learn({"pod": "vllm-0", "node": "node-1"}, 400.0)  # a late sample from before the move
    pod, node1, node2 = (
        anchor({"pod": "vllm-0"}, "vllm-0", "pod"),
        anchor({}, "node-1", "node"),
        anchor({}, "node-2", "node"),
    )
    assert topology.related(pod, node2) and not topology.related(pod, node1)
    topology.forget(now=1000.0 + 550.0, ttl=600.0)  # 550 s after the newest sighting: still known
    assert topology.related(pod, node2)


def test_the_learned_merge_clock_is_not_moved_back_by_a_late_anomaly() -> None:
    recent: dict[str, tuple[float, str]] = {}
    assert len(merge_learned([_anomaly("sequence_anomaly", "GPU-1", 600.0, "lstm")], recent)) == 1
    # a late forest verdict about a scrape long before: published (a different episode) ...
    assert len(merge_learned([_anomaly("metric_outlier", "GPU-1", 300.0, "iforest")], recent)) == 1
    # ... but the episode clock stays at 600: the forest's verdict 40 s after the LSTM's joins it
    assert merge_learned([_anomaly("metric_outlier", "GPU-1", 640.0, "iforest")], recent) == []
