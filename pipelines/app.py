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

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

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

    async def decode(self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str) -> E | None:
        """Decode ``raw`` as ``cls``; on failure dead-letter it and return None so the agent goes on."""
        try:
            if raw is None:
                raise EventError(f"{cls.__name__}: empty message (tombstone)")
            return cls.from_bytes(raw)
        except EventError as exc:
            await self.dead_letter(raw=raw or b"", key=key, source_topic=cls.topic, error=exc, consumer=consumer)
            return None


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, with the fetch wait taken from our settings.

    aiokafka sends at most one fetch request per broker at a time, naming only the partitions whose
    fetched records have all been handed out. When every busy partition still has records buffered, the
    request names only idle ones (the log and event topics, say) and the broker holds it for the whole
    fetch wait; the busy partitions, drained meanwhile, wait behind it. Faust fixes that wait at 1500 ms,
    which left a detect worker idle half the time when catching up and added up to 1.5 s of latency.
    """

    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # read by AIOKafkaConsumer.start() when it builds its Fetcher; Faust offers no setting for it
        consumer._fetch_max_wait_ms = getattr(transport, "fetch_max_wait_ms", 1500)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with a configurable fetch wait (see :class:`_ConsumerThread`)."""

    Consumer = _Consumer
    fetch_max_wait_ms = 1500


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
        web_bind=settings.faust_web_host,
        autodiscover=False,
        datadir=str(settings.run_dir / "faust"),
    )
    transport = _Transport(app.conf.broker_consumer, app)
    transport.fetch_max_wait_ms = settings.faust_fetch_max_wait_ms
    app.transport = transport  # before anything asks the app for its transport
    return Pipeline(app=app, topics=declare_topics(app, settings), settings=settings)


class PipelinePorts:
    """What every role's ports do through the pipeline: decode a message, dead-letter one.

    The roles (:class:`~pipelines.correlate.role.CorrelateRole`, :class:`~pipelines.detect.DetectRole`)
    reach Kafka only through their ports, so a unit test can give them in-memory ones; the Faust ports
    of each role add what is its own (its topic, its table) to these two.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def decode(self, cls: type[E], raw: bytes | None, key: bytes | None, *, consumer: str) -> E | None:
        return await self.pipeline.decode(cls, raw, key, consumer=consumer)

    async def dead_letter(
        self, *, raw: bytes, key: bytes | None, source_topic: str, error: BaseException | str, consumer: str
    ) -> None:
        await self.pipeline.dead_letter(raw=raw, key=key, source_topic=source_topic, error=error, consumer=consumer)


class PipelineWorker(faust.Worker):
    """Faust's worker that also says, in one plain line, when its role is ready.

    Faust announces readiness through loggers that ``medic`` keeps at WARNING (they narrate every
    connection at INFO), so ``medic stack`` and anyone reading the log wait for this line instead:
    it is printed once the agents run and the partitions are assigned.

    Args:
        app: the pipeline's Faust app.
        role: the role's name, for the line.
        **kwargs: Faust's worker options (``loglevel``...).
    """

    def __init__(self, app: faust.App, *, role: str, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self.role = role

    async def on_startup_finished(self) -> None:
        """Faust's own readiness work, then the line."""
        await super().on_startup_finished()
        print(f"ready: {self.role} pipeline consumes its partitions", flush=True)
