"""The live diagnostician's change feed: rollouts from telemetry.events.v1 (real Kafka) and the
current ReplicaSets from a server speaking the Kubernetes API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from services.core.bus import KafkaPublisher, ensure_topics
from services.core.events import KubeEvent, ObjectRef
from services.core.settings import Settings
from services.diagnostician.changefeed import ChangeFeed, current_replica_sets
from services.diagnostician.diagnostician import RankerDiagnostician
from services.diagnostician.service import start_change_feed
from services.diagnostician.tools import ChangeLog
from tests.conftest import poll

pytestmark = pytest.mark.integration


def scaled(deployment: str, replica_set: str, ts: float, direction: str = "up") -> KubeEvent:
    return KubeEvent(
        reason="ScalingReplicaSet",
        involved_object=ObjectRef(kind="Deployment", name=deployment, namespace="llm"),
        message=f"Scaled {direction} replica set {replica_set} to 1",
        ts=ts,
        source_component="deployment-controller",
    )


def test_the_feed_reads_back_its_lookback_and_follows_new_rollouts(kafka_ready: None, settings: Settings) -> None:
    ensure_topics(settings)
    publisher = KafkaPublisher(settings)
    now = time.time()
    publisher.publish(scaled("llama-70b", "llama-70b-7d9f", now - 60))  # a scale of the current ReplicaSet
    publisher.send_raw(KubeEvent.topic, b"junk", b"{not an event")
    publisher.flush()
    changes = ChangeLog({"llama-70b": "llama-70b-7d9f"})
    feed, stop = ChangeFeed(settings, changes, lookback_s=600), threading.Event()
    feed.start(stop)
    try:
        poll(feed.caught_up.is_set, 30, what="the feed to read its lookback")
        assert [c.kind for c in changes.changes] == ["scale"]
        assert feed.skipped == 1
        publisher.publish(scaled("llama-70b", "llama-70b-5c4b", now))  # a new pod template: a rollout
        publisher.flush()
        poll(lambda: len(changes.changes) == 2, 30, what="the rollout to reach the change log")
    finally:
        stop.set()
        publisher.close()
    rollout = changes.changes[-1]
    assert (rollout.kind, rollout.deployment, rollout.replica_set) == ("rollout", "llama-70b", "llama-70b-5c4b")
    assert changes.between(["llama-70b"], now - 1, now + 1) == [rollout]


def test_the_service_gives_its_ranker_a_fed_change_log(kafka_ready: None, settings: Settings) -> None:
    ensure_topics(settings)
    doctor = RankerDiagnostician(settings, embedder=None, use_database=False)
    stop = threading.Event()
    try:
        feed = start_change_feed(settings, doctor, stop)
        assert feed is not None and doctor.change_log is feed.changes
        poll(feed.caught_up.is_set, 30, what="the feed to start")
    finally:
        stop.set()


@pytest.fixture
def kube_api() -> Iterator[str]:
    def rs(name: str, owner: str | None, revision: str) -> dict[str, Any]:
        annotations = {"deployment.kubernetes.io/revision": revision}
        meta: dict[str, Any] = {"name": name, "namespace": "llm", "annotations": annotations}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": owner, "uid": "u"}]
        return {"metadata": meta, "spec": {"selector": {"matchLabels": {"app": owner or name}}}}

    body = json.dumps(
        {
            "kind": "ReplicaSetList",
            "apiVersion": "apps/v1",
            "metadata": {"resourceVersion": "1"},
            "items": [
                rs("llama-70b-7d9f", "llama-70b", "3"),
                rs("llama-70b-5c4b", "llama-70b", "4"),
                rs("mistral-7b-11aa", "mistral-7b", "1"),
                rs("orphan-0", None, "9"),
            ],
        }
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 200 if self.path.startswith("/apis/apps/v1/replicasets") else 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if status == 200 else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_current_replica_sets_are_the_newest_revision_of_each_deployment(kube_api: str) -> None:
    api = client.ApiClient(client.Configuration(host=kube_api))
    assert current_replica_sets(api) == {"llama-70b": "llama-70b-5c4b", "mistral-7b": "mistral-7b-11aa"}


def test_no_kubernetes_api_means_an_empty_seed_not_an_error() -> None:
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    assert current_replica_sets(api) == {}
