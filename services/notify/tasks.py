"""Celery tasks of the notify service (the only notify module that imports celery).

============================  ======  ==========  ===============================================
task                          queue   acks        retries
============================  ======  ==========  ===============================================
clustermedic.notify.deliver   notify  late        autoretry on RetryableDelivery: exponential
                                                  backoff with full jitter, at least Retry-After;
                                                  PermanentDelivery is recorded, never retried
============================  ======  ==========  ===============================================

``acks_late`` is safe because the task is idempotent: each delivery claims its idempotency key in
Redis (:mod:`services.notify.ledger`) before posting, so a redelivered message, or the same decision
enqueued twice, posts once. :func:`enqueue` is what the correlation agent and the notifier
(:mod:`services.notify.service`) call. A notification enqueued without context (the correlation
agent's) is rendered with the incident's latest diagnosis and remediation as the notifier recorded
them (:mod:`services.notify.state`), so every incident update carries its root cause and action.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
import redis
from celery import Task
from celery.utils.time import get_exponential_backoff_interval

from services.alerting.config import RoutingConfig
from services.alerting.notification import Notification
from services.celery_app import app
from services.core.events import Diagnosis, RemediationEvent
from services.core.settings import Settings
from services.notify.base import DeliveryResult, Message, NotifyContext
from services.notify.config import NotifySettings
from services.notify.errors import PermanentDelivery, RetryableDelivery
from services.notify.ledger import DeliveryLedger
from services.notify.plan import Delivery, plan
from services.notify.registry import NOTIFIERS
from services.notify.state import RedisIncidentStore
from services.notify.threads import RedisThreadStore

log = logging.getLogger(__name__)

MAX_RETRIES = 8
"""Retries after the first attempt: with the backoff below, about ten minutes of trying."""
RETRY_BACKOFF_S = 1
RETRY_BACKOFF_MAX_S = 300
RETRY_AFTER_MAX_S = 900
"""A vendor's Retry-After is honoured up to this; beyond it the message would be stale anyway."""


@dataclass
class _Runtime:
    settings: NotifySettings
    redis: redis.Redis
    ledger: DeliveryLedger
    context: NotifyContext
    incidents: RedisIncidentStore


_runtime: _Runtime | None = None


def runtime() -> _Runtime:
    """This worker process's clients, built on first use from the environment's settings."""
    global _runtime
    if _runtime is None:
        settings = NotifySettings()
        client = redis.Redis.from_url(Settings().broker_url)
        _runtime = _Runtime(
            settings=settings,
            redis=client,
            ledger=DeliveryLedger(
                client,
                dedup_ttl_s=settings.dedup_ttl_s,
                claim_lease_s=settings.claim_lease_s,
                prefix=settings.key_prefix,
            ),
            context=NotifyContext(
                settings=settings,
                http=httpx.Client(follow_redirects=False),
                threads=RedisThreadStore(client, settings.thread_ttl_s, settings.key_prefix),
            ),
            incidents=RedisIncidentStore(client, settings.incident_ttl_s, settings.key_prefix),
        )
    return _runtime


@app.task(
    bind=True,
    name="clustermedic.notify.deliver",
    queue="notify",
    acks_late=True,
    autoretry_for=(RetryableDelivery,),
    retry_backoff=RETRY_BACKOFF_S,
    retry_backoff_max=RETRY_BACKOFF_MAX_S,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def deliver(self: Task, delivery: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
    """Deliver one notification to one integration, at most once.

    Args:
        delivery: a :class:`~services.notify.plan.Delivery` as JSON.
        context: ``diagnosis`` / ``remediation`` events (as JSON) to render along; None (a correlate
            notification): the incident's latest ones, as the notifier recorded them.

    Returns:
        The :class:`~services.notify.base.DeliveryResult` as JSON (``skipped`` says why when a copy
        found the delivery already done or in progress).

    Raises:
        PermanentDelivery: the vendor refused it; recorded in the ledger, not retried.
        RetryableDelivery: out of retries (recorded), or on the way to a retry.
    """
    rt = runtime()
    job = Delivery.model_validate(delivery)
    if context is None:
        message = _with_recorded_context(job, rt.incidents)
    else:
        message = Message(
            notification=job.notification,
            diagnosis=Diagnosis.model_validate(context["diagnosis"]) if context.get("diagnosis") else None,
            remediation=(
                RemediationEvent.model_validate(context["remediation"]) if context.get("remediation") else None
            ),
        )
    retries = int(self.request.retries or 0)
    owner = f"{self.request.id}:{retries}"
    claim = rt.ledger.claim(job.key, owner)
    if claim != "claimed":
        log.info("notify %s %s: skipped, delivery already %s", job.integration, job.key, claim)
        return DeliveryResult(notifier=job.notifier, receiver=job.notification.receiver, skipped=claim).model_dump()

    notifier = NOTIFIERS.load(job.notifier)(
        job.config,
        NotifyContext(
            settings=rt.settings, http=rt.context.http, threads=rt.context.threads, global_config=job.global_config
        ),
    )
    try:
        result = notifier.send(message)
    except RetryableDelivery as exc:
        if retries >= (self.max_retries or 0):
            rt.ledger.failed(job.key, owner, f"out of retries: {exc}")
            log.error("notify %s: giving up after %d retries: %s", job.integration, retries, exc)
            raise
        countdown = get_exponential_backoff_interval(
            factor=int(self.retry_backoff),
            retries=retries,
            maximum=self.retry_backoff_max,
            full_jitter=self.retry_jitter,
        )
        if exc.retry_after is not None:
            countdown = max(countdown, min(exc.retry_after, RETRY_AFTER_MAX_S))
        rt.ledger.retry(job.key, owner, f"{self.request.id}:{retries + 1}", countdown)
        log.warning("notify %s: retry %d in %.0f s: %s", job.integration, retries + 1, countdown, exc)
        # Our own retry (not autoretry's) so the countdown honours Retry-After and the ledger names it.
        raise self.retry(exc=exc, countdown=countdown) from exc
    except PermanentDelivery as exc:
        rt.ledger.failed(job.key, owner, str(exc))
        log.error("notify %s: refused, not retried: %s", job.integration, exc)
        raise
    except Exception as exc:
        # A bug, not a vendor answer: free the key so a redelivery may try, and let Celery record it.
        rt.ledger.failed(job.key, owner, f"{type(exc).__name__}: {exc}")
        raise
    rt.ledger.delivered(job.key, owner, result.external_id)
    log.info("notify %s: delivered (%s)", job.integration, result.status_code)
    return result.model_dump()


def _with_recorded_context(job: Delivery, incidents: RedisIncidentStore) -> Message:
    """The message of a notification enqueued without context, with its incident's recorded context."""
    n = job.notification
    try:
        state = incidents.get(n.incident_id) if n.incident_id else None
    except (redis.RedisError, ValueError) as exc:
        # the context is an addition: a notification goes out without it rather than not at all
        log.warning("notify %s: no recorded context for incident %s: %s", job.integration, n.incident_id, exc)
        state = None
    if state is None:
        return Message(notification=n)
    return Message(notification=n, diagnosis=state.diagnosis, remediation=state.remediation)


def enqueue(
    notification: Notification,
    routing_config: RoutingConfig,
    *,
    diagnosis: Diagnosis | None = None,
    remediation: RemediationEvent | None = None,
    event: str = "",
) -> list[str]:
    """Send one ``deliver`` task per notifier config of the notification's receiver.

    Args:
        notification: the correlation engine's (or the notifier's) decision.
        routing_config: the loaded routing.yaml (receivers and globals).
        diagnosis: diagnosis to render along.
        remediation: remediation event to render along. With neither, the worker renders the
            incident's latest diagnosis and remediation as the notifier recorded them.
        event: what caused a notifier decision, part of the idempotency key
            (:func:`~services.notify.ledger.idempotency_key`).

    Returns:
        The task ids, in routing.yaml order (empty for a receiver without notifiers).
    """
    context: dict[str, Any] | None = None
    if diagnosis is not None or remediation is not None:
        context = {}
        if diagnosis is not None:
            context["diagnosis"] = diagnosis.model_dump(mode="json")
        if remediation is not None:
            context["remediation"] = remediation.model_dump(mode="json")
    ids = []
    for job in plan(notification, routing_config, event=event):
        result = deliver.apply_async(args=[job.model_dump(mode="json"), context], queue="notify")
        ids.append(str(result.id))
    return ids
