"""Celery task of the reports service (the only reports module that imports celery).

============================  =======  ==========  ================================================
task                          queue    acks        retries
============================  =======  ==========  ================================================
clustermedic.reports.render   reports  late        autoretry with backoff while the stored incident
                                                   has not caught up with the resolved event, while
                                                   PostgreSQL is unreachable, and on a retryable
                                                   Slack answer; a refused Slack post is logged
============================  =======  ==========  ================================================

The notifier (``medic notifier``, :mod:`services.notify.service`) enqueues it with :func:`enqueue_report`
when an incident's ``resolved`` event arrives: the notifier already follows every incident event and
knows which receivers it notified, hence which Slack threads the incident has. The task renders the
report, stores it and indexes it into the knowledge base (:func:`services.reports.archive.archive_report`),
then posts its summary with a link (``GET /api/v1/incidents/{id}/report``, from
``CLUSTERMEDIC_NOTIFY_EXTERNAL_URL``) in the incident's thread of each Slack app config of those receivers.

``acks_late`` is safe because the task is idempotent: the report is keyed by incident and version (a
redelivered task finds it stored), and each channel's post is recorded in the report's row before the
task moves on, so a retry posts only where it has not. It has its own queue because rendering the plots
takes about a second of CPU, which must not hold up notification deliveries.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from services.alerting.config import RoutingConfig
from services.celery_app import REPORT_TASK, app
from services.core.errors import InfraNotReady
from services.notify.errors import RetryableDelivery
from services.reports.errors import IncidentNotFound, NotCaughtUp

log = logging.getLogger(__name__)

MAX_RETRIES = 10
RETRY_BACKOFF_S = 2
RETRY_BACKOFF_MAX_S = 120


@app.task(
    bind=True,
    name=REPORT_TASK,
    queue="reports",
    acks_late=True,
    autoretry_for=(NotCaughtUp, InfraNotReady, RetryableDelivery),
    retry_backoff=RETRY_BACKOFF_S,
    retry_backoff_max=RETRY_BACKOFF_MAX_S,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def render(
    self: Task,
    incident_id: str,
    resolved_ts: float | None = None,
    slack: list[dict[str, Any]] | None = None,
    global_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Render, store and index the incident's report once, then post its summary to its Slack threads.

    Args:
        incident_id: the resolved incident.
        resolved_ts: the resolved event's time: a stored incident older than it is retried.
        slack: the Slack app configs (``slack_configs`` entries with an app token, as written in
            routing.yaml) of the receivers notified about the incident.
        global_config: routing.yaml's ``global`` block.

    Returns:
        ``incident_id``, ``version``, ``created`` (False: it was stored already), ``kb_doc_id``,
        ``posted`` (channel -> message ts) and ``refused`` (channel -> Slack's error); or ``incident_id``
        and ``skipped`` (why) when no such incident is stored.
    """
    import httpx
    import redis

    from services.core.settings import Settings
    from services.diagnostician.embedder import make_embedder
    from services.notify.config import NotifySettings
    from services.notify.errors import NotifyError
    from services.notify.slack_app import SlackAppNotifier
    from services.notify.threads import RedisThreadStore
    from services.reports.archive import archive_report, mark_posted, report_url, slack_summary

    settings = Settings()
    try:
        stored = archive_report(settings, incident_id, embedder=make_embedder(settings), not_before=resolved_ts)
    except IncidentNotFound as exc:
        # correlate upserts an incident when it opens, long before it resolves: this is no race to wait out
        log.warning("report of %s: %s; nothing rendered", incident_id, exc)
        return {"incident_id": incident_id, "skipped": str(exc)}
    refused: dict[str, str] = {}
    posted = dict(stored.posted)
    if slack:
        from services.notify.base import NotifyContext

        ns = NotifySettings()
        text, blocks = slack_summary(stored, report_url(ns.external_url, incident_id))
        client = redis.Redis.from_url(settings.broker_url)
        with httpx.Client(follow_redirects=False) as http:
            context = NotifyContext(
                settings=ns,
                http=http,
                threads=RedisThreadStore(client, ns.thread_ttl_s, ns.key_prefix),
                global_config=global_config or {},
            )
            for config in slack:
                channel = str(config.get("channel") or "")
                if channel in posted:
                    continue  # posted by an earlier try of this task
                try:
                    result = SlackAppNotifier(config, context).post_in_thread(incident_id, text, blocks)
                except RetryableDelivery:
                    raise
                except NotifyError as exc:  # refused for good: the report stays stored and indexed
                    log.error("report of %s: Slack %s refused the summary: %s", incident_id, channel, exc)
                    refused[channel] = str(exc)
                    continue
                mark_posted(settings, stored, channel, result.external_id)
                posted[channel] = result.external_id
        client.close()
    return {
        "incident_id": incident_id,
        "version": stored.version.isoformat(),
        "created": stored.created,
        "kb_doc_id": stored.kb_doc_id,
        "posted": posted,
        "refused": refused,
    }


def slack_targets(routing: RoutingConfig, receivers: tuple[str, ...]) -> list[dict[str, Any]]:
    """The Slack app configs (thread-capable: with an app token) of these receivers, once each channel."""
    from services.notify.slack_webhook import has_app_token

    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name in receivers:
        try:
            receiver = routing.receiver(name)
        except KeyError:
            continue  # a receiver the notifier remembers but routing.yaml no longer defines
        for config in receiver.slack_configs:
            channel = str(config.get("channel") or "")
            if has_app_token(config) and channel and channel not in seen:
                seen.add(channel)
                out.append(dict(config))
    return out


def enqueue_report(incident_id: str, resolved_ts: float, routing: RoutingConfig, receivers: tuple[str, ...]) -> str:
    """Send one ``clustermedic.reports.render`` task for a resolved incident; return its id.

    Args:
        incident_id: the incident.
        resolved_ts: the resolved event's time.
        routing: the loaded routing.yaml (the receivers' Slack configs and its globals).
        receivers: the receivers the notifier notified about the incident.
    """
    glob = routing.global_.model_dump(exclude_none=True, exclude={"resolve_timeout"})
    result = render.apply_async(
        args=[incident_id, resolved_ts, slack_targets(routing, receivers), glob], queue="reports"
    )
    return str(result.id)
