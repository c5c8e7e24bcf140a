import json

import pytest
from pydantic import ValidationError

from services.core.errors import DecodeError, SchemaError
from services.core.events import ALL_EVENTS, EVENTS_BY_TOPIC, Anomaly, DeadLetter, MetricBatch
from services.core.examples import example_events


def test_every_topic_of_the_architecture_has_one_model():
    assert sorted(EVENTS_BY_TOPIC) == sorted(
        [
            "telemetry.metrics.v1",
            "telemetry.logs.v1",
            "telemetry.events.v1",
            "anomalies.v1",
            "incidents.v1",
            "diagnoses.v1",
            "remediations.v1",
            "deadletter.v1",
        ]
    )
    assert len(ALL_EVENTS) == len(EVENTS_BY_TOPIC)


@pytest.mark.parametrize("event", example_events(1_800_000_000.0), ids=lambda e: type(e).__name__)
def test_examples_round_trip_through_bytes(event):
    again = type(event).from_bytes(event.to_bytes())
    assert again == event
    assert json.loads(event.to_bytes())["schema_version"] == 1
    assert event.key()


def test_events_are_frozen():
    event = example_events(1.0)[3]
    with pytest.raises(ValidationError):
        event.score = 3.0  # type: ignore[misc]


def test_unknown_fields_are_tolerated_and_dropped():
    raw = json.loads(example_events(1.0)[3].to_bytes())
    raw["added_in_v2"] = {"x": 1}
    anomaly = Anomaly.from_bytes(json.dumps(raw).encode())
    assert anomaly.entity == raw["entity"]
    assert "added_in_v2" not in anomaly.model_dump()


def test_not_json_is_a_decode_error():
    with pytest.raises(DecodeError, match="not UTF-8 JSON"):
        MetricBatch.from_bytes(b"\xff\xfe garbage")


def test_invalid_json_names_the_bad_field():
    with pytest.raises(SchemaError, match="samples"):
        MetricBatch.from_bytes(b'{"entity": "GPU-1", "samples": 3}')
    with pytest.raises(SchemaError, match="JSON object"):
        MetricBatch.from_bytes(b"[1, 2]")


def test_dead_letter_keeps_the_raw_bytes_and_reason():
    letter = DeadLetter.of(
        raw=b"\x00bad", source_topic="telemetry.logs.v1", error=SchemaError("nope"), consumer="c", ts=1.0,
        source_key=b"pod-1",
    )
    again = DeadLetter.from_bytes(letter.to_bytes())
    assert again.raw == b"\x00bad"
    assert again.error_type == "SchemaError"
    assert again.key() == "pod-1"


def test_log_record_key_prefers_entity_then_pod():
    from services.core.events import LogRecord

    assert LogRecord(line="x", ts=1, stream={"pod": "p", "node": "n"}).key() == "p"
    assert LogRecord(line="x", ts=1, stream={"pod": "p"}, entity="GPU-1").key() == "GPU-1"
