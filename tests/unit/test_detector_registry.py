import inspect

from pipelines.detectors.base import Detector
from pipelines.detectors.registry import DETECTORS
from tests.made_up_xids import made_up_xid_catalog


def test_every_registered_detector_loads_and_honours_the_contract():
    assert len(DETECTORS) >= 1
    for name in DETECTORS:
        cls = DETECTORS.load(name)
        # a detector that reads a catalog by default (the XID rules: NVIDIA's, from ../shared/data) gets a
        # made-up one; its default is the data tier's to check (tests/data/test_xid_catalog.py)
        takes_catalog = "catalog" in inspect.signature(cls).parameters
        detector = cls(catalog=made_up_xid_catalog()) if takes_catalog else cls()
        assert isinstance(detector, Detector), name
        assert detector.name == name
        _state, anomalies = detector.detect([], detector.initial_state())
        assert anomalies == []
