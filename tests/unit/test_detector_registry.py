from pipelines.detectors.base import Detector
from pipelines.detectors.registry import DETECTORS


def test_every_registered_detector_loads_and_honours_the_contract():
    assert len(DETECTORS) >= 1
    for name in DETECTORS:
        cls = DETECTORS.load(name)
        detector = cls()
        assert isinstance(detector, Detector), name
        assert detector.name == name
        _state, anomalies = detector.detect([], detector.initial_state())
        assert anomalies == []
