"""The remediator: consume ``diagnoses.v1`` and hand each diagnosis to the executor.

The executor decides (policy, guardrails, levels) and records the run; a level-1 decision starts the
Celery chain, a level-2 one waits for approval, a level-3 one pages. Submitting the same diagnosis
twice is the same run (its id is derived from the diagnosis), so the at-least-once consumer loop
(services.core.consumer) never starts a playbook twice. Undecodable input goes to ``deadletter.v1``.
"""

from __future__ import annotations

import logging
import threading
import time

from services.core.bus import KafkaPublisher
from services.core.consumer import consume
from services.core.errors import ClusterMedicError, EventError
from services.core.events import DeadLetter, Diagnosis
from services.core.settings import Settings
from services.remediation.executor import Executor

log = logging.getLogger(__name__)

CONSUMER = "remediator"


def run(
    settings: Settings,
    executor: Executor,
    *,
    stop: threading.Event | None = None,
    max_messages: int | None = None,
    poll_timeout_ms: int = 500,
) -> int:
    """Submit diagnoses until ``stop`` is set or ``max_messages`` were handled; return how many were."""
    return consume(
        settings,
        Diagnosis.topic,
        CONSUMER,
        lambda raw, key, publisher: handle(raw, key, executor, publisher),
        stop=stop,
        max_messages=max_messages,
        poll_timeout_ms=poll_timeout_ms,
    )


def handle(raw: bytes, key: bytes | None, executor: Executor, publisher: KafkaPublisher) -> None:
    """Submit one diagnoses.v1 message; bad input is dead-lettered, never raised."""
    try:
        diagnosis = Diagnosis.from_bytes(raw)
    except EventError as exc:
        publisher.publish(
            DeadLetter.of(
                raw=raw, source_topic=Diagnosis.topic, error=exc, consumer=CONSUMER, ts=time.time(), source_key=key
            )
        )
        return
    try:
        run_id, decision = executor.submit(diagnosis)
    except ClusterMedicError as exc:
        # the store or the actuator failed: the diagnosis is logged, the loop goes on
        log.error("cannot submit the diagnosis of %s: %s", diagnosis.incident_id, exc)
        return
    log.info("incident %s: run %s -> %s", diagnosis.incident_id, run_id, decision.outcome)
