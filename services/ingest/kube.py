"""Kubernetes events watcher: list, then watch from the list's resourceVersion, forever.

The protocol, as the API server speaks it:

- ``list`` returns the current events and a collection ``resourceVersion``;
- ``watch`` from that version streams ADDED / MODIFIED / DELETED events, BOOKMARK events that only
  advance the version, and an ERROR event with code 410 (Gone) when the version is too old;
- a connection can drop at any time: watch again from the last version seen;
- after a 410, list again: the relist returns objects already delivered, so every delivered
  ``(uid, resourceVersion)`` is remembered and skipped (an event object changes its version when its
  count goes up, which *is* news and is delivered).

Auth: in-cluster config when running in a pod, else a kubeconfig (``ingest_k8s_kubeconfig`` or
``~/.kube/config``).

Once the first list is published the watcher logs ``ready: events watch follows <server> ...``, once
per process (``medic stack`` counts one ready line per start).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from services.core.events import DeadLetter, KubeEvent
from services.core.settings import Settings
from services.ingest.dedup import DeliveredKeys
from services.ingest.errors import RejectedInput
from services.ingest.normalise import kube_event
from services.ingest.timebounds import TimeCheck

log = logging.getLogger(__name__)

Emit = Callable[[list[KubeEvent | DeadLetter]], None]


def api_client(settings: Settings) -> client.ApiClient:
    """An ApiClient with in-cluster credentials when available, else the kubeconfig's."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        path = str(settings.ingest_k8s_kubeconfig) if settings.ingest_k8s_kubeconfig else None
        return config.new_client_from_config(config_file=path)


class EventWatcher:
    """Streams Kubernetes events (core/v1 or events.k8s.io/v1) as KubeEvents, none lost or repeated.

    Args:
        api: the ApiClient to use (see :func:`api_client`).
        emit: called with each round's new events (and dead letters for events that do not normalise).
        api_group: ``core`` (v1 Events) or ``events`` (events.k8s.io/v1).
        namespace: follow one namespace; empty: all.
        watch_timeout_s: server-side timeout of one watch request (then it is renewed).
        remember: how many delivered event versions are kept for dedup across relists.
        time_window: makes the event-time window at a wall-clock time (:meth:`TimeCheck.of` with the
            settings): an event stamped outside it is dead-lettered (reason out_of_bounds); None: no bound.
    """

    def __init__(
        self,
        api: client.ApiClient,
        emit: Emit,
        *,
        api_group: str = "core",
        namespace: str = "",
        watch_timeout_s: int = 300,
        remember: int = 100_000,
        time_window: Callable[[float], TimeCheck] | None = None,
    ) -> None:
        if api_group == "core":
            core = client.CoreV1Api(api)
            self._list: Callable[..., Any] = (
                (lambda **kw: core.list_namespaced_event(namespace, **kw))
                if namespace
                else core.list_event_for_all_namespaces
            )
        elif api_group == "events":
            events = client.EventsV1Api(api)
            self._list = (
                (lambda **kw: events.list_namespaced_event(namespace, **kw))
                if namespace
                else events.list_event_for_all_namespaces
            )
        else:
            raise ValueError(f"api_group must be 'core' or 'events', not {api_group!r}")
        self._emit = emit
        self._time_window = time_window
        self._timeout_s = watch_timeout_s
        self._seen = DeliveredKeys(ttl_s=7 * 86_400, capacity=remember)
        self._watch: watch.Watch | None = None
        self._stopped = False
        self._wake = threading.Event()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0
        self.ready = False
        version = "core/v1" if api_group == "core" else "events.k8s.io/v1"
        self._follows = (
            f"{api.configuration.host} ({version}, {f'namespace {namespace}' if namespace else 'all namespaces'})"
        )

    def stop(self) -> None:
        """Stop after the current watch request (closes its connection)."""
        self._stopped = True
        self._wake.set()
        if self._watch is not None:
            self._watch.stop()

    def run(self, *, backoff_s: float = 1.0) -> None:
        """List and watch until :meth:`stop`; reconnects on drops, relists on 410 Gone."""
        while not self._stopped:
            try:
                if not self.resource_version:
                    self.relist()  # an API server not up yet, or gone a while, is retried, not fatal
                    if not self.ready:
                        self.ready = True
                        log.info("ready: events watch follows %s", self._follows)
                self.watch_once()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch from %s is gone (410): relisting", self.resource_version)
                    self.resource_version = ""
                else:
                    log.warning("watch failed (%s): retrying", exc)
                    self.reconnects += 1
                    self._wake.wait(backoff_s)
            except Exception as exc:  # dropped connection, protocol error: watch again from the last version
                if self._stopped:
                    return
                log.info("watch connection ended (%s): resuming from %s", exc, self.resource_version)
                self.reconnects += 1
                self._wake.wait(backoff_s)

    def relist(self) -> None:
        """List every event, deliver those not delivered yet, and remember the list's version."""
        response = self._list(_preload_content=False)
        try:
            body = json.loads(response.data)
        except (ValueError, RecursionError) as exc:  # retried by run(), as a dropped connection is
            raise RejectedInput(f"event list is not JSON: {exc}", reason="json") from exc
        if not isinstance(body, dict):
            raise RejectedInput(f"event list is a JSON {type(body).__name__}, not an object", reason="schema")
        items, metadata = body.get("items"), body.get("metadata")
        if not isinstance(items, list | None) or not isinstance(metadata, dict | None):
            raise RejectedInput("event list is not an object with an items list", reason="schema")
        self.relists += 1
        self._deliver(items or [])
        self.resource_version = str((metadata or {}).get("resourceVersion") or "")

    def watch_once(self) -> None:
        """One watch request from the current version, until it ends."""
        self._watch = watch.Watch()
        stream: Iterator[dict[str, Any]] = self._watch.stream(
            self._list,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout_s,  # also tells Watch not to retry 410 itself: we relist
        )
        for item in stream:
            kind, obj = item.get("type"), item.get("raw_object") or {}
            version = str(_metadata(obj).get("resourceVersion") or "")
            if kind in ("ADDED", "MODIFIED"):
                self._deliver([obj])
            if version:
                self.resource_version = version
            if self._stopped:
                break

    def _deliver(self, objects: list[Any]) -> None:
        """Emit each object not delivered before as a KubeEvent, or as a dead letter on its own.

        One bad object (not an event, a field of the wrong type) must not drop the list it came in:
        it is dead-lettered and its neighbours are emitted.
        """
        out: list[KubeEvent | DeadLetter] = []
        reserved: list[str] = []
        now = time.time()
        for obj in objects:
            key = _delivery_key(obj)
            if not self._seen.reserve(key):
                continue
            reserved.append(key)
            try:
                check = self._time_window(now) if self._time_window is not None else None
                out.append(kube_event(obj, check))
            except RejectedInput as exc:
                out.append(_deadletter(obj, exc))
            except Exception as exc:  # a normaliser bug must not drop the neighbours either; it is logged loudly
                log.exception("event object could not be normalised")
                out.append(_deadletter(obj, exc))
        if out:
            try:
                self._emit(out)
            except Exception:
                for key in reserved:  # not delivered: let a relist deliver them again
                    self._seen.release(key)
                raise


def _metadata(obj: object) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _delivery_key(obj: object) -> str:
    """``uid/resourceVersion``: a new version of an event (its count went up) is news, a relist's repeat is not."""
    meta = _metadata(obj)
    if not meta:  # not an event object: its own bytes tell a repeat
        try:
            return "raw:" + json.dumps(obj, sort_keys=True, default=str)[:2000]
        except (ValueError, RecursionError):
            return "raw:" + repr(obj)[:2000]
    return f"{meta.get('uid', '')}/{meta.get('resourceVersion', '')}"[:2000]


def _deadletter(obj: object, error: BaseException) -> DeadLetter:
    try:
        raw = json.dumps(obj, default=str).encode("utf-8", "backslashreplace")
    except (ValueError, RecursionError):
        raw = repr(obj).encode("utf-8", "backslashreplace")
    return DeadLetter.of(
        raw=raw[:262_144],
        source_topic="k8s:events",
        error=error,
        consumer="ingest",
        ts=time.time(),
        source_key=str(_metadata(obj).get("uid", ""))[:500],
    )
