"""The aiokafka publisher without a broker: a clear error, and no thread left behind."""

from __future__ import annotations

import threading

import pytest

from services.core.errors import InfraNotReady
from services.core.settings import Settings
from services.ingest.aiopublisher import AioKafkaPublisher


def test_no_broker_is_infra_not_ready_and_leaves_no_thread() -> None:
    before = {thread.name for thread in threading.enumerate()}
    with pytest.raises(InfraNotReady, match=r"no Kafka broker at 127\.0\.0\.1:9"):
        AioKafkaPublisher(Settings(kafka_bootstrap="127.0.0.1:9"), start_timeout_s=10)
    assert {thread.name for thread in threading.enumerate()} - before == set()
