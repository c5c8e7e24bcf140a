"""The correlate role's ack/checkpoint protocol, without a broker (pipelines/correlate/role.py).

The Faust agents only loop over :class:`CorrelateRole`'s methods; here an in-memory
:class:`CorrelatePorts` stands in for the cluster topic, ``incidents.v1``, the producer and the state
table, and records the order in which things happen. The same protocol runs against the real broker in
tests/integration/test_correlate_restart.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.correlate.correlator import Correlator
from pipelines.correlate.history import AnomalyHistory
from pipelines.correlate.role import ANOMALY, KIND_HEADER, RUN, CorrelateOptions, CorrelateRole, E
from services.alerting.config import loads_routing
from services.alerting.notification import Notification
from services.alerting.silences import Silence
from services.core.errors import EventError
from services.core.events import Anomaly, IncidentEvent, RemediationEvent, RemediationStatus

ROUTING = loads_routing(
    """
route: {receiver: team, group_by: [alertname], group_wait: 0s, group_interval: 1m, repeat_interval: 1h}
receivers:
  - {name: team, webhook_configs: [{url: "http://127.0.0.1:9/hook"}]}
"""
)


@dataclass
class Ports:
    """The broker and the state table, in memory; ``log`` is what happened, in order."""

    log: list[str] = field(default_factory=list)
    table: dict[str, bytes] = field(default_factory=dict)
    sent: list[tuple[str, bytes, str]] = field(default_factory=list)
    incidents: list[IncidentEvent] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)

    async def to_cluster(self, cluster: str, value: bytes, kind: str) -> None:
        self.sent.append((cluster, value, kind))

    async def publish_incident(self, event: IncidentEvent) -> None:
        self.incidents.append(event)
        self.log.append(f"publish {event.kind}")

    async def flush(self) -> None:
        self.log.append("flush")

    def saved_state(self, cluster: str) -> bytes | None:
        return self.table.get(cluster)

    async def save_state(self, cluster: str, state: bytes) -> None:
        self.table[cluster] = state
        self.log.append(f"state {cluster}")

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


@dataclass
class Store:
    log: list[str]

    def save_incidents(self, events: Sequence[IncidentEvent]) -> None:
        self.log.append(f"save {len(events)} incidents")

    def save_anomalies(self, anomalies: Sequence[Anomaly]) -> list[tuple[Anomaly, str]]:
        self.log.append(f"save {len(anomalies)} anomalies")
        return []

    def prune_anomalies(self, older_than: float) -> int:
        return 0

    def silences(self) -> list[Silence]:
        return []

    def close(self) -> None:
        pass


@dataclass
class Message:
    partition: int
    offset: int
    headers: dict[str, bytes]


@dataclass
class Event:
    key: bytes
    value: bytes
    message: Message


class Stream:
    """What Faust's ``stream.noack()`` is to the role: it acks."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.acked: list[int] = []

    async def ack(self, event: Event) -> None:
        self.acked.append(event.message.offset)
        self.log.append(f"ack {event.message.offset}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def role(ports: Ports, clock: Clock | None = None, notified: list[Notification] | None = None) -> CorrelateRole:
    clock = clock or Clock()
    return CorrelateRole(
        Correlator(ROUTING, clock),
        ports,
        Store(ports.log),
        (notified if notified is not None else []).append,
        AnomalyHistory(86400.0, 500, 3600.0),
        clock,
        CorrelateOptions(checkpoint_s=5.0),
    )


def anomaly(entity: str, ts: float) -> bytes:
    return Anomaly(
        entity=entity,
        entity_kind="gpu",
        signal="gpu_ecc",
        detector="gpu_rules",
        score=2.0,
        threshold=1.0,
        ts=ts,
        labels={"node": "n1"},
    ).to_bytes()


def message(offset: int, value: bytes, kind: str = ANOMALY) -> Event:
    return Event(b"default", value, Message(0, offset, {KIND_HEADER: kind.encode()}))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_message_is_acked_only_by_the_checkpoint_after_what_it_caused_is_durable() -> None:
    ports = Ports()
    correlate = role(ports)
    stream = Stream(ports.log)

    async def scenario() -> None:
        await correlate.apply(stream, message(0, anomaly("GPU-1", 1000.0)))
        assert stream.acked == []  # applied and emitted, not acked
        await correlate.checkpoint()

    run(scenario())
    assert ports.log == [
        "publish opened",
        "save 1 incidents",
        # the checkpoint: the anomaly history, the producer, then the state, then the acks
        "save 1 anomalies",
        "flush",
        "state default",
        "ack 0",
    ]


def test_after_a_crash_the_restored_state_acks_a_redelivery_without_applying_it_again() -> None:
    ports = Ports()
    first, stream = role(ports), Stream(ports.log)
    messages = [message(0, anomaly("GPU-1", 1000.0)), message(1, anomaly("GPU-2", 1001.0))]

    async def before_the_crash() -> None:
        for m in messages:
            await first.apply(stream, m)
        await first.checkpoint()

    run(before_the_crash())
    published = len(ports.incidents)
    # a new worker on the same table; the broker redelivers both (their offsets were not committed)
    second, again = role(ports), Stream(ports.log)

    async def after_the_restart() -> None:
        for m in messages:
            await second.apply(again, m)
        await second.apply(again, message(2, anomaly("GPU-3", 1002.0)))

    run(after_the_restart())
    assert again.acked == [0, 1]  # at once: they are in the checkpoint already
    assert second.pending and second.pending[0][1].message.offset == 2  # the new one waits for a checkpoint
    assert len(ports.incidents) == published + 1  # only the new message acted


def test_a_crash_before_the_checkpoint_repeats_the_same_actions_with_the_same_ids() -> None:
    ports = Ports()
    m = message(0, anomaly("GPU-1", 1000.0))
    run(role(ports).apply(Stream(ports.log), m))  # applied and emitted, never checkpointed
    run(role(ports).apply(Stream(ports.log), m))  # the redelivery after the crash
    first, second = ports.incidents
    assert (first.kind, first.incident_id) == (second.kind, second.incident_id)  # an idempotent upsert


def test_a_checkpoint_is_due_only_with_something_to_write_and_checkpoint_s_after_the_last() -> None:
    ports, clock = Ports(), Clock()
    correlate = role(ports, clock)
    assert not correlate.checkpoint_due()
    run(correlate.apply(Stream(ports.log), message(0, anomaly("GPU-1", 1000.0))))
    assert not correlate.checkpoint_due()  # 0 s since the role started
    clock.now += 5.0
    assert correlate.checkpoint_due()
    run(correlate.checkpoint())
    assert not correlate.checkpoint_due()


def test_a_bad_anomaly_is_dead_lettered_and_routing_goes_on() -> None:
    ports = Ports()
    correlate = role(ports)

    @dataclass
    class Item:
        key: bytes | None
        value: bytes

    run(correlate.route(Item(None, b"{not json")))
    run(correlate.route(Item(None, anomaly("GPU-1", 1000.0))))
    assert len(ports.letters) == 1 and ports.letters[0].startswith("correlate-route:")
    assert [(cluster, kind) for cluster, _, kind in ports.sent] == [("default", ANOMALY)]


def test_a_run_event_goes_to_every_cluster_and_a_step_event_to_none() -> None:
    ports = Ports()
    correlate = role(ports)
    correlate.correlator.engine("east")

    @dataclass
    class Item:
        key: bytes | None
        value: bytes

    def event(status: RemediationStatus, step: str = "") -> Item:
        return Item(
            b"inc-1",
            RemediationEvent(
                incident_id="inc-1", run_id="run-1", playbook="restart_pod", status=status, level=1, step=step, ts=1.0
            ).to_bytes(),
        )

    run(correlate.remediation(event("running", step="restart")))
    run(correlate.remediation(event("awaiting_approval")))
    assert ports.sent == []
    run(correlate.remediation(event("running")))
    assert sorted(cluster for cluster, _, kind in ports.sent if kind == RUN) == ["default", "east"]
    assert json.loads(ports.sent[0][1]) == {"incident_id": "inc-1", "run_id": "run-1", "status": "running"}
