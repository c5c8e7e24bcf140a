"""The detect role's steps without a broker (pipelines/detect.py: DetectRole, in-memory ports).

What a user would notice if these broke: one bad scrape or log line losing its neighbours, an entity's
state saved once per scrape instead of once per micro-batch (or to the wrong changelog partition),
anomalies never published. tests/integration/test_detect_pipeline.py runs the same role on Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipelines.detect import DetectorSet, DetectRole, E
from pipelines.detectors.rules_xid import XidDetector
from services.core.errors import EventError
from services.core.events import Anomaly, LogRecord, MetricBatch, Sample
from services.core.settings import Settings
from tests.made_up_xids import made_up_xid_catalog


@dataclass
class Ports:
    published: list[Anomaly] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    saves: list[tuple[int, str]] = field(default_factory=list)

    async def publish(self, anomalies: Sequence[Anomaly]) -> None:
        self.published.extend(anomalies)

    async def decode(self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str) -> E | None:
        try:
            return cls.from_bytes(raw or b"")
        except EventError as exc:
            await self.dead_letter(raw=raw or b"", key=key, source_topic=cls.topic, error=exc, consumer=consumer)
            return None

    async def dead_letter(
        self, *, raw: bytes, key: bytes | None, source_topic: str, error: BaseException | str, consumer: str
    ) -> None:
        self.letters.append(f"{consumer}: {error}")

    def saved_state(self, entity: str) -> dict[str, Any] | None:
        return self.states.get(entity)

    def save_state(self, partition: int, entity: str, state: dict[str, Any]) -> None:
        self.states[entity] = state
        self.saves.append((partition, entity))

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        return asyncio.ensure_future(work)


@dataclass
class Message:
    partition: int


@dataclass
class Event:
    key: bytes | None
    value: bytes
    message: Message


class Exploding:
    """A log detector with a bug: it raises on any line that mentions 'boom'."""

    name: ClassVar[str] = "exploding"
    consumes: ClassVar[type] = LogRecord
    signals: ClassVar[frozenset[str]] = frozenset({"boom"})

    def initial_state(self) -> int:
        return 0

    def detect(self, batch: Sequence[LogRecord], state: int) -> tuple[int, list[Anomaly]]:
        found = []
        for record in batch:
            if "boom" in record.line:
                raise ValueError("a detector bug")
            found.append(
                Anomaly(entity=record.line, signal="boom", detector=self.name, score=1.0, threshold=0.5, ts=record.ts)
            )
        return state + len(batch), found


GPU = "GPU-5d4c3b2a-0000-1111-2222-333344445555"


def scrape(code: float, ts: float) -> bytes:
    labels = {"UUID": GPU, "gpu": "0", "Hostname": "gpu-node-3"}
    return MetricBatch(
        entity=GPU, samples=(Sample(name="DCGM_FI_DEV_XID_ERRORS", labels=labels, value=code, ts=ts),)
    ).to_bytes()


def role(detectors: DetectorSet, ports: Ports) -> DetectRole:
    return DetectRole(detectors, ports, Settings())


def test_a_micro_batch_saves_each_entity_once_to_its_source_partition_and_dead_letters_only_the_bad_scrape() -> None:
    ports = Ports()
    detect = role(DetectorSet.of([XidDetector(catalog=made_up_xid_catalog())]), ports)
    events = [
        Event(GPU.encode(), scrape(0, 100.0), Message(3)),
        Event(None, b"{not a batch", Message(3)),
        Event(GPU.encode(), scrape(79, 115.0), Message(3)),
    ]
    asyncio.run(detect.metrics(events))  # type: ignore[arg-type]  # stand-ins for Faust events
    assert len(ports.letters) == 1 and ports.letters[0].startswith("detect-metrics:")
    assert ports.saves == [(3, GPU)]  # once for the micro-batch, on the partition the scrapes came from
    assert [(a.signal, a.entity) for a in ports.published] == [("gpu_xid", GPU)]


def test_a_log_line_that_makes_a_detector_raise_is_dead_lettered_alone() -> None:
    ports = Ports()
    detect = role(DetectorSet.of([Exploding()]), ports)
    lines = [LogRecord(line=text, ts=1.0 + i).to_bytes() for i, text in enumerate(["fine", "boom", "also fine"])]
    asyncio.run(detect.logs([*lines, b"not json"]))
    assert [a.entity for a in ports.published] == ["fine", "also fine"]  # its neighbours are processed
    assert sorted(letter.split(":")[0] for letter in ports.letters) == ["detect-logs", "detect-logs"]
    assert any("a detector bug" in letter for letter in ports.letters)
