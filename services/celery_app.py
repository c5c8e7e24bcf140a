"""The Celery application: named queues, shared task options and the health task.

Faust decides, Celery acts: anything that changes the world is a task here or in a task module. The
app object exists at import time without configuration; each entrypoint (``medic worker``, the API,
a test) calls :func:`configure` with its Settings before sending or running tasks.

Queues:
    default      health checks and housekeeping
    remediation  playbook actions (acknowledged early, never auto-retried)
    verify       read-only verification (retried with backoff)
    notify       Slack / PagerDuty / webhook deliveries (retried on 429 and 5xx)
    reports      post-incident reports rendered when an incident resolves (a second of CPU each)
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from celery import Celery
from kombu import Queue

from services.core.settings import Settings

QUEUES = ("default", "remediation", "verify", "notify", "reports")
RECOVER_TASK = "clustermedic.remediation.recover"
REPORT_TASK = "clustermedic.reports.render"

app = Celery("clustermedic", include=["services.remediation.tasks", "services.notify.tasks", "services.reports.tasks"])


def configure(settings: Settings, *, recover_interval_s: float | None = None) -> Celery:
    """Point the app at the settings' Redis and set the options every task shares.

    Calling it again with another Redis (a test, a tool) also drops the connection, producer and
    result-backend caches, which Celery would otherwise keep pointing at the first broker.

    Args:
        settings: the process settings.
        recover_interval_s: when given, the beat schedule sends the remediation recovery sweep this
            often (only a process that runs beat, e.g. ``medic worker``, needs it).
    """
    previous = app.conf.broker_url if app.configured else None
    app.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.broker_url,
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="default",
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        # a prefetched task is a task a dying worker takes with it: fetch one at a time
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        timezone="UTC",
    )
    if recover_interval_s is not None:
        app.conf.beat_schedule = beat_schedule(recover_interval_s)
    if previous is not None and previous != settings.broker_url:
        app._after_fork()  # Celery's own reset of the connection and producer pools
        app._backend_cache = None
        app._local = threading.local()
    return app


def beat_schedule(recover_interval_s: float) -> dict[str, dict[str, Any]]:
    """The periodic tasks: the remediation recovery sweep.

    Every worker may run beat (``medic worker`` does by default, with an in-memory schedule), so the
    sweep does not depend on one process surviving; duplicate sweeps are harmless because each
    abandoned run is claimed by one conditional update. A sweep nobody takes within one interval
    expires instead of piling up in the queue.
    """
    return {
        RECOVER_TASK: {
            "task": RECOVER_TASK,
            "schedule": recover_interval_s,
            "options": {"queue": "default", "expires": recover_interval_s},
        }
    }


@app.task(name="clustermedic.health.ping", acks_late=True)
def ping(payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Answer with the payload, the worker's host and pid: proves broker -> worker -> result backend."""
    return {"pong": payload or {}, "host": socket.gethostname(), "pid": os.getpid(), "ts": time.time()}
