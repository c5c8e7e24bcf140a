from pipelines.detect import DetectorSet, EntityDetection
from pipelines.detectors.rules_xid import XidDetector
from services.core.events import MetricBatch, Sample


def _batch(ts: float, xid: float) -> MetricBatch:
    labels = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0", "pod": "p"}
    return MetricBatch(
        entity="GPU-1",
        samples=(
            Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=xid, ts=ts),
            Sample(name="DCGM_FI_DEV_GPU_UTIL", labels=labels, value=50, ts=ts),
        ),
    )


def test_state_is_saved_every_few_scrapes_and_whenever_an_anomaly_fires():
    entity = EntityDetection(DetectorSet.of([XidDetector()]), checkpoint_every=3)
    saved = [entity.on_batch(_batch(t * 15.0, 0), None)[0] is not None for t in range(6)]
    assert saved == [False, False, True, False, False, True]
    snapshot, _, anomalies = entity.on_batch(_batch(90.0, 79), None)
    assert anomalies and snapshot is not None


def test_a_restarted_worker_resumes_from_the_saved_state_without_firing_again():
    first = EntityDetection(DetectorSet.of([XidDetector()]), checkpoint_every=1)
    first.on_batch(_batch(0, 0), None)
    snapshot, _, anomalies = first.on_batch(_batch(15, 79), None)
    assert len(anomalies) == 1 and snapshot is not None
    restarted = EntityDetection(DetectorSet.of([XidDetector()]), checkpoint_every=1)
    _, _, again = restarted.on_batch(_batch(30, 79), snapshot)
    assert again == [], "the same XID, still set, must not page twice after a restart"
