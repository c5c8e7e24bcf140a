"""The one Faust app of ClusterMedic.

``create_pipeline(settings)`` builds the app, declares every topic once and returns both with the
dead-letter helper; roles (smoke, detect, correlate...) register their agents on it. Nothing here reads
the environment: the entrypoint builds the Settings and passes them in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TypeVar

import faust

from pipelines.topics import Topics, declare_topics
from services.core.errors import EventError
from services.core.events import DeadLetter, Event
from services.core.settings import Settings

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


@dataclass
class Pipeline:
    """A Faust app with its declared topics and the settings it was built from."""

    app: faust.App
    topics: Topics
    settings: Settings

    async def dead_letter(
        self,
        *,
        raw: bytes,
        key: bytes | None,
        source_topic: str,
        error: BaseException | str,
        consumer: str,
    ) -> None:
        """Send a message the agent could not accept to ``deadletter.v1`` with the reason."""
        letter = DeadLetter.of(
            raw=raw, source_topic=source_topic, error=error, consumer=consumer, ts=time.time(), source_key=key
        )
        log.warning("dead-lettered a message from %s: %s", source_topic, letter.error)
        await self.topics.deadletter.send(key=letter.key().encode(), value=letter.to_bytes())

    async def decode(
        self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str
    ) -> E | None:
        """Decode ``raw`` as ``cls``; on failure dead-letter it and return None so the agent goes on."""
        try:
            if raw is None:
                raise EventError(f"{cls.__name__}: empty message (tombstone)")
            return cls.from_bytes(raw)
        except EventError as exc:
            await self.dead_letter(
                raw=raw or b"", key=key, source_topic=cls.topic, error=exc, consumer=consumer
            )
            return None


def create_pipeline(settings: Settings, *, app_id: str | None = None, web_enabled: bool = False) -> Pipeline:
    """Build the Faust app and declare every topic.

    Args:
        settings: Kafka address, partition count, topic prefix.
        app_id: consumer-group id; defaults to ``settings.faust_app_id`` plus the topic prefix.
        web_enabled: start Faust's web server (the worker CLI turns it on for health checks).
    """
    app = faust.App(
        app_id or f"{settings.topic_prefix}{settings.faust_app_id}",
        broker=[f"kafka://{server}" for server in settings.bootstrap_servers.split(",")],
        store="memory://",
        topic_partitions=settings.kafka_partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=web_enabled,
        web_port=settings.faust_web_port,
        autodiscover=False,
        datadir=str(settings.run_dir / "faust"),
    )
    return Pipeline(app=app, topics=declare_topics(app, settings), settings=settings)
