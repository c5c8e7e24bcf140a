"""A task through the real Redis broker and a real Celery worker process."""

from __future__ import annotations

import os

import pytest

from services.celery_app import configure, ping
from services.core.settings import Settings

pytestmark = pytest.mark.integration


def test_ping_round_trips_through_redis_and_the_worker(celery_worker):
    configure(Settings())
    result = ping.delay({"n": 1})
    answer = result.get(timeout=60)
    assert answer["pong"] == {"n": 1}
    assert answer["pid"] != os.getpid(), "the task ran in the test process, not in the worker"
    assert celery_worker.poll() is None, "the worker died"


def test_a_task_routed_to_the_remediation_queue_is_consumed(celery_worker):
    configure(Settings())
    result = ping.apply_async(args=[{"queue": "remediation"}], queue="remediation")
    assert result.get(timeout=60)["pong"] == {"queue": "remediation"}
