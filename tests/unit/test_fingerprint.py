"""The one fingerprint function: stable values, order-free label sets, no collisions by separators."""

from __future__ import annotations

from pipelines.detectors.rules_common import fingerprint as rule_fingerprint
from services.core.events import Anomaly
from services.core.fingerprint import fingerprint, label_fingerprint


def test_detector_fingerprints_keep_the_values_stored_before() -> None:
    # SHA-256 of the parts joined by U+001F, 16 hex digits: what every detector produced so far, so
    # alerts in checkpoints and rows in the anomaly history keep their identity
    assert fingerprint("xid_rules", "gpu_xid", "GPU-1") == "85efb148a71d5d69"
    assert rule_fingerprint("xid_rules", "gpu_xid", "GPU-1") == "85efb148a71d5d69"
    assert fingerprint("iforest", "metric_outlier", "pod-a", "vllm:ttft") == "5c3e572adad9ecd0"


def test_a_label_set_has_one_fingerprint_whatever_its_order() -> None:
    a = label_fingerprint({"alertname": "x", "node": "n1"})
    assert a == label_fingerprint({"node": "n1", "alertname": "x"})
    assert a != label_fingerprint({"alertname": "x", "node": "n2"})
    assert len(a) == 16 and int(a, 16) >= 0


def test_a_separator_inside_a_part_cannot_make_two_inputs_one_fingerprint() -> None:
    assert fingerprint("a\x1fb", "c") != fingerprint("a", "b\x1fc")
    assert label_fingerprint({"a": "x\x1fb\x1fy"}) != label_fingerprint({"a": "x", "b": "y"})
    assert fingerprint("a\x1e", "b") != fingerprint("a", "\x1eb")
    assert fingerprint("\ud800")  # a lone surrogate (valid in Python's JSON) hashes too


def test_a_delivery_key_tells_states_apart_and_redeliveries_not() -> None:
    firing = Anomaly(
        entity="GPU-1", signal="gpu_xid", detector="xid_rules", score=1, threshold=1, ts=10.0, fingerprint="f1"
    )
    assert firing.delivery_key() == firing.model_copy().delivery_key()
    assert firing.delivery_key() != firing.model_copy(update={"status": "resolved"}).delivery_key()
    assert firing.delivery_key() != firing.model_copy(update={"ts": 11.0}).delivery_key()
    assert firing.model_copy(update={"dedup_key": "k"}).delivery_key() == "k"
    # no fingerprint: detector, signal and entity stand for the identity
    anonymous = firing.model_copy(update={"fingerprint": ""})
    assert anonymous.delivery_key() != anonymous.model_copy(update={"entity": "GPU-2"}).delivery_key()


def test_a_label_fingerprint_is_alertmanagers_fnv_of_the_sorted_label_set() -> None:
    # Alertmanager names a pushed alert by this value: both sides must agree (test_notify_delivery)
    assert label_fingerprint({}) == "cbf29ce484222325"  # FNV-1a 64 offset basis: the empty label set
    assert label_fingerprint({"\ud800": "x"}) != label_fingerprint({"y": "x"})  # a lone surrogate still hashes
