"""The smoke role: one agent that reads every event topic, validates each message and reports it.

It proves the wiring (publisher -> Kafka -> Faust -> model) and is what ``make demo`` shows. Invalid
messages go to ``deadletter.v1``; the agent keeps consuming.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pipelines.app import Pipeline
from services.core.events import ALL_EVENTS, DeadLetter, Event

OnEvent = Callable[[Event], Awaitable[None]]


def register_smoke(pipeline: Pipeline, on_event: OnEvent) -> None:
    """Register the smoke agent; ``on_event`` receives every valid event."""
    sources = [cls for cls in ALL_EVENTS if cls is not DeadLetter]
    models = {pipeline.settings.topic(cls.topic): cls for cls in sources}
    channel = pipeline.app.topic(
        *models, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )

    @pipeline.app.agent(channel, name="smoke")
    async def smoke(stream):  # type: ignore[no-untyped-def]
        async for item in stream.events():
            cls = models[item.message.topic]
            event = await pipeline.decode(cls, item.value, item.key, consumer="smoke")
            if event is not None:
                await on_event(event)
