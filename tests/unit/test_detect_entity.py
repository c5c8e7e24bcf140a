import asyncio

from pipelines.detect import DetectorSet, EntityDetection
from pipelines.detectors.rules_xid import XidDetector
from services.core.events import MetricBatch, Sample
from tests.made_up_xids import REBOOT_CODE, made_up_xid_catalog


def _batch(ts: float, xid: float) -> MetricBatch:
    labels = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0", "pod": "p"}
    return MetricBatch(
        entity="GPU-1",
        samples=(
            Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=xid, ts=ts),
            Sample(name="DCGM_FI_DEV_GPU_UTIL", labels=labels, value=50, ts=ts),
        ),
    )


def _xid_rules() -> DetectorSet:
    return DetectorSet.of([XidDetector(made_up_xid_catalog())])


def test_state_is_saved_every_few_scrapes_and_whenever_an_anomaly_fires() -> None:
    entity = EntityDetection(_xid_rules(), checkpoint_every=3)
    saved = [entity.on_batch(_batch(t * 15.0, 0), None)[0] is not None for t in range(6)]
    assert saved == [False, False, True, False, False, True]
    snapshot, _, anomalies = entity.on_batch(_batch(90.0, REBOOT_CODE), None)
    assert anomalies and snapshot is not None


def test_a_restarted_worker_resumes_from_the_saved_state_without_firing_again() -> None:
    first = EntityDetection(_xid_rules(), checkpoint_every=1)
    first.on_batch(_batch(0, 0), None)
    snapshot, _, anomalies = first.on_batch(_batch(15, REBOOT_CODE), None)
    assert len(anomalies) == 1 and snapshot is not None
    restarted = EntityDetection(_xid_rules(), checkpoint_every=1)
    _, _, again = restarted.on_batch(_batch(30, REBOOT_CODE), snapshot)
    assert again == [], "the same XID, still set, must not page twice after a restart"


def test_a_worker_catching_up_saves_an_entity_at_most_once_per_checkpoint_interval() -> None:
    entity = EntityDetection(_xid_rules(), checkpoint_every=2, checkpoint_min_s=1.0)
    # a backlog: eight scrapes of one GPU handled within half a second, then one more a second later
    saved = [entity.on_batch(_batch(t * 15.0, 0), None, now=100.0 + t * 0.05)[0] is not None for t in range(8)]
    assert saved == [False, True, False, False, False, False, False, False]
    assert entity.on_batch(_batch(120.0, 0), None, now=101.5)[0] is not None
    # an anomaly is saved at once, however recent the last save
    snapshot, _, anomalies = entity.on_batch(_batch(135.0, REBOOT_CODE), None, now=101.6)
    assert anomalies and snapshot is not None


def test_scrapes_at_their_usual_interval_keep_the_every_few_scrapes_rhythm() -> None:
    entity = EntityDetection(_xid_rules(), checkpoint_every=3, checkpoint_min_s=1.0)
    saved = [entity.on_batch(_batch(t * 15.0, 0), None, now=t * 15.0)[0] is not None for t in range(6)]
    assert saved == [False, False, True, False, False, True]


def test_grouping_a_scrape_once_for_all_rule_detectors_keeps_each_label_and_batch_apart() -> None:
    from pipelines.detectors.rules_common import snapshots

    two_pods = MetricBatch(
        entity="node-1",
        samples=(
            Sample(name="m", labels={"pod": "a"}, value=1, ts=15),
            Sample(name="m", labels={"pod": "b"}, value=2, ts=15),
        ),
    )
    by_pod = [(s.entity, s.value("m")) for s in snapshots([two_pods], entity_label="pod")]
    by_gpu = [(s.entity, s.value("m")) for s in snapshots([two_pods], entity_label="UUID")]
    assert by_pod == [("a", 1), ("b", 2)]
    assert by_gpu == [("node-1", 1)], "no UUID label: the batch's entity, both samples in one snapshot"
    assert [(s.entity, s.value("m")) for s in snapshots([two_pods], entity_label="pod")] == by_pod
    # an equal-looking but different scrape is grouped anew, not served from the last one
    later = two_pods.model_copy(update={"samples": (Sample(name="m", labels={"pod": "a"}, value=9, ts=30),)})
    assert [(s.entity, s.ts, s.value("m")) for s in snapshots([later], entity_label="pod")] == [("a", 30, 9)]


def test_faust_workers_fetch_with_the_configured_wait_not_faust_s_fixed_1500_ms() -> None:
    from pipelines.app import create_pipeline
    from services.core.settings import Settings

    async def build() -> int:
        app = create_pipeline(Settings(faust_fetch_max_wait_ms=42)).app
        consumer = app.consumer._thread._create_worker_consumer(app.transport)  # built, not started
        return int(consumer._fetch_max_wait_ms)

    assert asyncio.run(build()) == 42


def test_the_forest_and_the_lstm_flagging_one_scrape_make_one_anomaly() -> None:
    from pipelines.detect import merge_learned
    from services.core.events import Anomaly

    def anomaly(detector: str, entity: str, ts: float, signal: str = "metric_outlier") -> Anomaly:
        return Anomaly(
            entity=entity, entity_kind="gpu", signal=signal, detector=detector, score=2.0, threshold=1.0,
            severity="warning", ts=ts, evidence={"top": {"temp_c": 9.0}}, fingerprint=f"{detector}/{entity}",
        )

    merged = merge_learned(
        [
            anomaly("iforest", "GPU-1", 15.0),
            anomaly("iforest", "GPU-2", 15.0),
            anomaly("lstm", "GPU-1", 15.0, "sequence_anomaly"),
            anomaly("lstm", "GPU-1", 30.0, "sequence_anomaly"),  # a later scrape: its own anomaly
            anomaly("revision_rules", "GPU-1", 15.0, "revision_regression"),  # not a learned detector
        ]
    )
    assert [(a.detector, a.entity, a.ts) for a in merged] == [
        ("iforest", "GPU-1", 15.0),
        ("iforest", "GPU-2", 15.0),
        ("lstm", "GPU-1", 30.0),
        ("revision_rules", "GPU-1", 15.0),
    ]
    (also,) = merged[0].evidence["corroborated_by"]
    assert also["detector"] == "lstm" and also["signal"] == "sequence_anomaly" and also["top"] == {"temp_c": 9.0}
    assert "corroborated_by" not in merged[1].evidence


def test_the_other_learned_detector_a_scrape_or_two_later_joins_the_published_anomaly() -> None:
    from pipelines.detect import merge_learned
    from services.core.events import Anomaly

    def anomaly(detector: str, ts: float) -> Anomaly:
        return Anomaly(
            entity="GPU-1", entity_kind="gpu", signal="x", detector=detector, score=2.0, threshold=1.0,
            severity="warning", ts=ts, fingerprint=detector,
        )

    recent: dict[str, tuple[float, str]] = {}
    assert len(merge_learned([anomaly("lstm", 285.0)], recent)) == 1
    assert merge_learned([anomaly("iforest", 300.0)], recent) == []  # the same episode, 15 s on
    assert len(merge_learned([anomaly("lstm", 600.0)], recent)) == 1  # the LSTM's next episode
    assert len(merge_learned([anomaly("iforest", 900.0)], recent)) == 1  # five minutes later: its own
