"""The smoke flow behind ``make demo``: one event of each type through the real broker.

It publishes the example events (plus one malformed message) to fresh topics, consumes them with the
smoke Faust agent running in this process, and reports what arrived, how long each took, and what
went to the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from services.core.bus import KafkaPublisher, ensure_topics, read_raw
from services.core.events import (
    Anomaly,
    DeadLetter,
    Diagnosis,
    Event,
    IncidentEvent,
    KubeEvent,
    LogRecord,
    MetricBatch,
    RemediationEvent,
)
from services.core.examples import example_events
from services.core.settings import Settings

MALFORMED = b'{"entity": "GPU-broken", "samples": "not a list"}'


@dataclass
class SmokeResult:
    """What the smoke flow saw."""

    sent: list[Event]
    received: list[tuple[Event, float]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every valid event arrived and the malformed one was dead-lettered by the agent."""
        expected = {type(e) for e in self.sent if not isinstance(e, DeadLetter)}
        arrived = {type(e) for e, _ in self.received}
        by_agent = [d for d in self.dead_letters if d.consumer == "smoke"]
        return expected <= arrived and any(d.raw == MALFORMED for d in by_agent)


def run_smoke(settings: Settings, *, timeout_s: float = 60.0) -> SmokeResult:
    """Run the smoke flow on topics prefixed ``demo.<time>.`` so each run starts clean."""
    from pipelines.app import create_pipeline
    from pipelines.smoke import register_smoke

    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}demo.{time.time_ns()}."})
    ensure_topics(settings)
    now = time.time()
    result = SmokeResult(sent=example_events(now))
    with KafkaPublisher(settings) as publisher:
        for event in result.sent:
            publisher.publish(event)
        publisher.send_raw(MetricBatch.topic, b"GPU-broken", MALFORMED)
    expected = sum(1 for e in result.sent if not isinstance(e, DeadLetter))

    async def consume() -> None:
        pipeline = create_pipeline(settings)
        all_arrived = asyncio.Event()

        async def on_event(event: Event) -> None:
            result.received.append((event, time.time() - now))
            if len(result.received) >= expected:
                all_arrived.set()

        register_smoke(pipeline, on_event)
        await pipeline.app.start()
        try:
            await asyncio.wait_for(all_arrived.wait(), timeout_s)
            # the malformed message may sit on another partition than the last valid one: keep the
            # agent running until both dead letters (the example's and the agent's) are on the topic
            letters = await asyncio.to_thread(
                lambda: list(read_raw(settings, [DeadLetter.topic], max_messages=2, timeout_s=30))
            )
            result.dead_letters.extend(DeadLetter.from_bytes(value) for _, _, value in letters)
        except TimeoutError:
            pass  # SmokeResult.ok reports what is missing
        finally:
            await pipeline.app.stop()

    asyncio.run(consume())
    return result


def describe(event: Event) -> str:
    """One human line about an event, for the demo table."""
    if isinstance(event, MetricBatch):
        return ", ".join(f"{s.name}={s.value:g}" for s in event.samples)
    if isinstance(event, LogRecord):
        return event.line
    if isinstance(event, KubeEvent):
        return f"{event.type} {event.reason} x{event.count}: {event.message}"
    if isinstance(event, Anomaly):
        return f"{event.severity} {event.signal} by {event.detector} (score {event.score:g} > {event.threshold:g})"
    if isinstance(event, IncidentEvent):
        return f"{event.kind} {event.severity}: {event.title} ({len(event.alerts)} alert)"
    if isinstance(event, Diagnosis):
        top = event.hypotheses[0]
        return f"{top.cause} ({top.confidence:.0%}) -> {event.proposed_playbook} level {event.level}"
    if isinstance(event, RemediationEvent):
        return f"{event.playbook} {event.status} (level {event.level})"
    return type(event).__name__
