"""One record that cannot be serialised is dead-lettered on its own; its neighbours are published.

A Loki JSON line may carry the escape ``\\ud800``: it parses (to a lone surrogate) but UTF-8 cannot
encode it, so it fails on the publisher thread. It used to fail the whole publish round: the push got
503, the sender retried forever, and every good push in the same round failed with it.
"""

from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from services.core.events import DeadLetter, LogRecord
from services.core.settings import Settings
from services.ingest.http import LOKI_PUSH_PATH, create_app
from services.ingest.memory import MemoryPublisher


def _push(lines: list[str]) -> bytes:
    ns = str(time.time_ns())
    values = ",".join(f'["{ns}", {line}]' for line in lines)  # lines are JSON string literals, escapes kept
    return ('{"streams": [{"stream": {"job": "vllm", "pod": "vllm-0"}, "values": [' + values + "]}]}").encode()


def test_a_lone_surrogate_is_dead_lettered_alone_and_the_good_lines_are_published() -> None:
    publisher = MemoryPublisher()
    with TestClient(create_app(Settings(), publisher)) as client:  # type: ignore[arg-type]
        poison = _push([json.dumps("before"), '"bad \\ud800 line"', json.dumps("after")])
        answer = client.post(LOKI_PUSH_PATH, content=poison, headers={"Content-Type": "application/json"})
        assert answer.status_code == 204, answer.text
        good = client.post(
            LOKI_PUSH_PATH, content=_push([json.dumps("next push")]), headers={"Content-Type": "application/json"}
        )
        assert good.status_code == 204, good.text
        metrics = client.get("/metrics").text
    lines = [e.line for e in publisher.events(LogRecord) if isinstance(e, LogRecord)]
    assert lines == ["before", "after", "next push"]
    [letter] = publisher.deadletters()
    assert isinstance(letter, DeadLetter) and letter.source_topic == LogRecord.topic
    assert "cannot serialise" in letter.error and "surrogates not allowed" in letter.error
    assert b"bad \\ud800 line" in letter.raw  # what was refused is kept, escaped
    assert "clustermedic_ingest_unserialisable_total 1.0" in metrics
