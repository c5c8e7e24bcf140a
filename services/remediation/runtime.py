"""Wiring: build an :class:`~services.remediation.executor.Executor` from the settings at an entrypoint."""

from __future__ import annotations

import logging
import threading
import time

from services.core.bus import KafkaPublisher
from services.core.errors import InfraError
from services.core.events import IncidentEvent, RemediationEvent
from services.core.settings import Settings
from services.remediation.config import RemediationConfig, RemediationSettings, load_config
from services.remediation.executor import Dispatcher, EventSink, Executor
from services.remediation.registry import actuator_registry, playbook_registry
from services.remediation.store import RunStore

log = logging.getLogger(__name__)


class KafkaEventSink:
    """Publishes remediation and incident events through :class:`KafkaPublisher`.

    The audit log in Postgres is the record; a Kafka outage is logged and does not stop a remediation
    that is changing the world halfway through.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._publisher: KafkaPublisher | None = None
        self._lock = threading.Lock()

    def publish(self, event: RemediationEvent | IncidentEvent) -> None:
        """Publish and flush one event; log (never raise) when Kafka is unavailable."""
        with self._lock:
            try:
                if self._publisher is None:
                    self._publisher = KafkaPublisher(self._settings, linger_ms=0)
                self._publisher.publish(event)
                self._publisher.flush(10.0)
            except InfraError as exc:
                log.error("remediation event not published (%s): %s", exc, event.model_dump_json())
                self._publisher = None

    def close(self) -> None:
        """Close the producer."""
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None


class MemoryEventSink:
    """Keeps events in a list (tests, dry tools)."""

    def __init__(self) -> None:
        self.events: list[RemediationEvent | IncidentEvent] = []

    def publish(self, event: RemediationEvent | IncidentEvent) -> None:
        """Append the event."""
        self.events.append(event)


def build_executor(
    settings: Settings,
    rsettings: RemediationSettings,
    dispatcher: Dispatcher,
    *,
    events: EventSink | None = None,
    config: RemediationConfig | None = None,
) -> Executor:
    """Build the executor for one process.

    Args:
        settings: project settings (database, Kafka).
        rsettings: remediation settings (config path, actuator URL).
        dispatcher: schedules Celery work (services.remediation.tasks.CeleryDispatcher in production).
        events: event sink (default: Kafka).
        config: remediation config (default: loaded from ``rsettings.config``).
    """
    config = config or load_config(rsettings.config, actuator_url=rsettings.actuator_url)
    actuator_config = config.actuator
    if settings.sim_token and actuator_config.kind == "simulator":
        actuator_config = actuator_config.model_copy(update={"token": settings.sim_token})
    actuator = actuator_registry().load(actuator_config.kind).from_config(actuator_config)
    # event time: the wall clock in production; the world's (simulated) clock under the simulator
    clock = actuator.event_time if config.execution.clock == "world" else time.time
    return Executor(
        store=RunStore(settings),
        actuator=actuator,
        playbooks=playbook_registry(),
        config=config,
        events=events or KafkaEventSink(settings),
        dispatcher=dispatcher,
        clock=clock,
    )
