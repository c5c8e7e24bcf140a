"""A simulation against the wall clock, seen the way a real cluster is seen (``medic sim serve``).

One :class:`LiveSimulation` owns a :class:`~services.simulator.simulator.Simulator` and a thread that
steps it at ``speed`` simulated seconds per wall second. What it produces leaves through the same
doors a real cluster's telemetry does, so ClusterMedic's production ingest paths carry it to Kafka:

========================  ==================================================================
door                      what a real cluster has there
========================  ==================================================================
``GET /metrics``          dcgm-exporter and vLLM's ``/metrics`` (every node; ``/nodes/N/metrics``
                          for one), each sample stamped with its simulated time, so a real
                          Prometheus scraping it (``honor_timestamps``) keeps event time
Loki push                 the log agent (promtail, Alloy) pushing container and kernel logs to
                          ``--loki-url`` (the ingest receiver's ``/loki/api/v1/push``)
``GET /api/v1/events``    the Kubernetes API: an EventList, or with ``watch=true`` a stream of
                          watch events from a ``resourceVersion`` (410 Gone once it is too old),
                          which ``medic ingest watch-k8s`` follows through a kubeconfig
========================  ==================================================================

Time: simulated time runs ``speed`` times faster than the wall clock, and starts far enough in the past
(:func:`live_epoch`) that it reaches the wall clock only as the run ends, so no event is ever stamped in
the future. Every event carries its simulated time, and the pipeline's timers follow event time, so a
run at ``--speed 30`` decides what a run at ``--speed 1`` decides.

Everything that touches the simulator (a step, a control-API action, a scrape) holds
:attr:`LiveSimulation.lock`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.core.errors import ConfigError
from services.core.events import Event, KubeEvent, LogRecord, MetricBatch
from services.simulator.sinks import render_exposition

log = logging.getLogger(__name__)

MAX_SPEED = 1000.0
# Kubernetes keeps events for an hour; the watch window is counted in events, so memory is bounded
EVENTS_KEPT = 20_000
# Lines waiting for Loki when it is down: the oldest go first past this (a real agent's buffer)
LOG_BACKLOG = 200_000


def check_speed(speed: float) -> float:
    """Validate ``--speed``.

    Raises:
        ConfigError: not a finite number in (0, 1000].
    """
    if not math.isfinite(speed) or speed <= 0 or speed > MAX_SPEED:
        raise ConfigError(f"--speed must be above 0 and at most {MAX_SPEED:g} simulated seconds per wall second")
    return speed


def live_epoch(now: float, duration_s: float, speed: float) -> float:
    """UNIX time of simulated second 0 for a run of ``duration_s`` simulated seconds at ``speed``.

    Simulated time runs ``speed`` times faster than the wall clock. Started ``duration_s * (1 - 1/speed)``
    seconds in the past (on a whole minute), it never passes the wall clock and reaches it as the run
    ends: at ``--speed 1`` it is the wall clock; at ``--speed 30`` a 30-minute scenario starts 29
    minutes ago. So every timestamp is one a receiver that refuses the future (as Loki and ClusterMedic's
    ingest do) accepts, at any speed.
    """
    return 60.0 * math.floor((now - duration_s * (1.0 - 1.0 / speed)) / 60.0)


def rfc3339(ts: float) -> str:
    """``2026-12-01T09:00:00Z``: the Kubernetes API's timestamp format (whole seconds)."""
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def core_v1_event(event: KubeEvent, resource_version: int) -> dict[str, Any]:
    """The core/v1 ``Event`` object the API server would return for ``event``.

    ``services.ingest.normalise.kube_event`` reads it back into the same KubeEvent (a unit test checks
    the round trip), so the watch path adds nothing and loses nothing.
    """
    obj = event.involved_object
    stamp = rfc3339(event.ts)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{obj.name}.{resource_version:x}",
            "namespace": obj.namespace or "default",
            "uid": f"sim-event-{resource_version}",
            "resourceVersion": str(resource_version),
            "creationTimestamp": stamp,
        },
        "involvedObject": {"kind": obj.kind, "name": obj.name, "namespace": obj.namespace, "uid": obj.uid},
        "reason": event.reason,
        "message": event.message,
        "type": event.type,
        "count": event.count,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": event.source_component, "host": event.node},
    }


class EventLog:
    """The Kubernetes events a simulation produced, numbered like an API server's resourceVersions.

    Args:
        capacity: events kept; a watch from before the oldest kept is answered 410 Gone.
    """

    def __init__(self, capacity: int = EVENTS_KEPT) -> None:
        self._items: deque[tuple[int, dict[str, Any]]] = deque(maxlen=capacity)
        self._version = 0
        self._cond = threading.Condition()

    @property
    def version(self) -> int:
        """The newest resourceVersion (0 before any event)."""
        return self._version

    def add(self, events: list[KubeEvent]) -> None:
        """Number and keep events, and wake the watchers."""
        if not events:
            return
        with self._cond:
            for event in events:
                self._version += 1
                self._items.append((self._version, core_v1_event(event, self._version)))
            self._cond.notify_all()

    def listing(self, namespace: str = "") -> dict[str, Any]:
        """An ``EventList`` of what is kept, with the collection's resourceVersion."""
        with self._cond:
            items = [o for _, o in self._items if not namespace or o["metadata"]["namespace"] == namespace]
            version = self._version
        return {"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": str(version)}, "items": items}

    def since(self, version: int, namespace: str = "") -> list[dict[str, Any]] | None:
        """Events after ``version``; None when some of them were already dropped (410 Gone)."""
        with self._cond:
            if self._items and version < self._items[0][0] - 1:
                return None
            return [
                o for v, o in self._items if v > version and (not namespace or o["metadata"]["namespace"] == namespace)
            ]

    def wait(self, version: int, timeout_s: float) -> None:
        """Block until an event newer than ``version`` exists or ``timeout_s`` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self._version > version, timeout_s)

    def watch(self, version: int, namespace: str, timeout_s: float, stop: threading.Event) -> Iterator[bytes]:
        """The body of a watch request: one JSON watch event per line until ``timeout_s`` (or ``stop``)."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            batch = self.since(version, namespace)
            if batch is None:
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"too old resource version: {version} ({self._items[0][0] if self._items else 0})",
                    "reason": "Expired",
                    "code": 410,
                }
                yield json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
                return
            for obj in batch:
                yield json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
            if batch:
                version = int(batch[-1]["metadata"]["resourceVersion"])
            else:
                version = max(version, self.version) if not namespace else version
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wait(version, min(left, 1.0))


@dataclass
class LiveStats:
    """What the live view and ``/healthz`` report about the run."""

    steps: int = 0
    metric_batches: int = 0
    log_lines: int = 0
    kube_events: int = 0
    logs_pushed: int = 0
    log_push_errors: int = 0
    logs_dropped: int = 0
    behind_s: float = 0.0


class LatestMetrics:
    """The newest metric batch of every entity, per node: what a scrape of each exporter returns now."""

    def __init__(self, node_of: Any) -> None:
        self._node_of = node_of
        self._latest: dict[str, dict[str, MetricBatch]] = {}
        self._lock = threading.Lock()

    def keep(self, batches: list[MetricBatch]) -> None:
        """Replace each entity's batch with its newest."""
        with self._lock:
            for batch in batches:
                self._latest.setdefault(self._node_of(batch.entity) or "", {})[batch.entity] = batch

    def nodes(self) -> list[str]:
        """Nodes with metrics so far."""
        with self._lock:
            return sorted(n for n in self._latest if n)

    def render(self, node: str | None = None) -> str:
        """Exposition text of one node, or of every node, with simulated-time timestamps."""
        with self._lock:
            if node is None:
                batches = [b for per in self._latest.values() for b in per.values()]
            else:
                batches = list(self._latest.get(node, {}).values())
        return render_exposition(batches, timestamps=True)


class LogShipper:
    """Pushes log lines to a Loki push URL from its own thread, so a slow or absent Loki never stalls time.

    Lines wait in a bounded backlog while Loki is unreachable (the oldest are dropped past
    :data:`LOG_BACKLOG` and counted), as a log agent's buffer does.

    Args:
        url: the push URL (``.../loki/api/v1/push``).
        token: bearer token of the receiver, if it has one.
        stats: where push counts go.
        client: an ``httpx.Client`` (tests may pass one).
    """

    def __init__(self, url: str, token: str | None, stats: LiveStats, client: Any = None) -> None:
        import httpx

        self.url = url if url.endswith("/loki/api/v1/push") else url.rstrip("/") + "/loki/api/v1/push"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.Client(timeout=10.0, headers=headers)
        self._backlog: deque[LogRecord] = deque()
        self._lock = threading.Condition()
        self._stats = stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-log-shipper", daemon=True)

    def start(self) -> None:
        """Start pushing."""
        self._thread.start()

    def offer(self, records: list[LogRecord]) -> None:
        """Queue lines for the next push."""
        if not records:
            return
        with self._lock:
            self._backlog.extend(records)
            over = len(self._backlog) - LOG_BACKLOG
            for _ in range(max(0, over)):
                self._backlog.popleft()
            self._stats.logs_dropped += max(0, over)
            self._lock.notify()

    def _run(self) -> None:
        import httpx

        while not self._stop.is_set():
            with self._lock:
                self._lock.wait_for(lambda: bool(self._backlog) or self._stop.is_set(), 1.0)
                batch = [self._backlog.popleft() for _ in range(min(len(self._backlog), 5000))]
            if not batch:
                continue
            streams: dict[str, tuple[dict[str, str], list[list[str]]]] = {}
            for r in batch:
                streams.setdefault(json.dumps(r.stream, sort_keys=True), (r.stream, []))[1].append(
                    [str(round(r.ts * 1e9)), r.line]
                )
            body = {"streams": [{"stream": s, "values": v} for s, v in streams.values()]}
            try:
                answer = self._client.post(self.url, json=body)
                if answer.status_code >= 500 or answer.status_code == 429:
                    raise httpx.HTTPStatusError("retry", request=answer.request, response=answer)
                if answer.status_code >= 400:  # the receiver refused these lines: retrying cannot help
                    log.warning("Loki push refused (%s): %s", answer.status_code, answer.text[:300])
                    self._stats.logs_dropped += len(batch)
                    continue
                self._stats.logs_pushed += len(batch)
            except httpx.HTTPError as exc:
                self._stats.log_push_errors += 1
                log.warning("Loki push to %s failed (%s): retrying", self.url, exc)
                with self._lock:
                    self._backlog.extendleft(reversed(batch))
                self._stop.wait(1.0)

    def close(self) -> None:
        """Stop the thread (what is still queued is dropped) and close the client."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._client.close()


class LiveSimulation:
    """A simulator stepped against the wall clock, with its metrics, events and logs kept for serving.

    Args:
        sim: the simulator (built with ``epoch`` = the start's wall-clock minute).
        speed: simulated seconds per wall second.
        shipper: pushes logs to Loki; None keeps no logs (the control API and metrics still work).
        duration_s: stop stepping at this simulated second (None: the scenario's duration).
    """

    def __init__(
        self, sim: Any, speed: float, *, shipper: LogShipper | None = None, duration_s: float | None = None
    ) -> None:
        self.sim = sim
        self.speed = check_speed(speed)
        self.lock = threading.RLock()
        self.stats = LiveStats()
        self.events = EventLog()
        self.metrics = LatestMetrics(sim.node_of)
        self.shipper = shipper
        self.duration_s = sim.scenario.duration_s if duration_s is None else duration_s
        self.stopped = threading.Event()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-clock", daemon=True)
        self._started_at = 0.0

    def start(self) -> None:
        """Start the clock (and the log shipper)."""
        if self.shipper is not None:
            self.shipper.start()
        self._started_at = time.monotonic()
        self._thread.start()

    def handle(self, events: list[Event]) -> None:
        """Keep one step's events where the doors serve them from."""
        batches = [e for e in events if isinstance(e, MetricBatch)]
        kube = [e for e in events if isinstance(e, KubeEvent)]
        logs = [e for e in events if isinstance(e, LogRecord)]
        self.metrics.keep(batches)
        self.events.add(kube)
        if self.shipper is not None:
            self.shipper.offer(logs)
        self.stats.metric_batches += len(batches)
        self.stats.kube_events += len(kube)
        self.stats.log_lines += len(logs)

    def _run(self) -> None:
        try:
            while not self.stopped.is_set() and self.sim.t < self.duration_s:
                due = self._started_at + self.sim.t / self.speed
                wait = due - time.monotonic()
                if wait > 0 and self.stopped.wait(wait):
                    break
                with self.lock:
                    events = self.sim.step()
                self.stats.steps += 1
                self.stats.behind_s = max(0.0, time.monotonic() - due)
                self.handle(events)
        except Exception:  # the simulator's own bug: say so loudly, keep serving what was produced
            log.exception("the simulation stopped at t=%.0f s", self.sim.t)
        finally:
            self.finished.set()

    def now(self) -> float:
        """Simulated seconds so far."""
        return float(self.sim.t)

    def stop(self) -> None:
        """Stop the clock and the shipper."""
        self.stopped.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        if self.shipper is not None:
            self.shipper.close()


# ---------------------------------------------------------------------------------------- serving


def create_live_app(live: LiveSimulation, listener: Any) -> Any:
    """The one HTTP server of ``medic sim serve``: metrics, the Kubernetes events API and the control API.

    Args:
        live: the running simulation.
        listener: from :func:`services.core.exposure.check_listener` (token, exposure).
    """
    from fastapi import FastAPI, HTTPException, Query, Response
    from fastapi.responses import StreamingResponse
    from prometheus_client import CollectorRegistry, generate_latest

    from services.core.exposure import BearerAuth, export_listener
    from services.simulator.http import TOKEN_VARIABLE, create_http_app

    control = create_http_app(live.sim, listener=listener, lock=live.lock, clock_running=True)
    app = FastAPI(title="ClusterMedic live simulation")
    if listener.token:
        app.add_middleware(BearerAuth, token=listener.token, token_variable=TOKEN_VARIABLE)
    registry = CollectorRegistry()
    export_listener(listener, registry)
    stop = live.stopped

    @app.get("/metrics")
    def metrics() -> Response:
        body = live.metrics.render() + generate_latest(registry).decode()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/nodes/{node}/metrics")
    def node_metrics(node: str) -> Response:
        if node not in live.metrics.nodes():
            raise HTTPException(404, f"no node {node!r}; nodes: {', '.join(live.metrics.nodes())}")
        return Response(live.metrics.render(node), media_type="text/plain; version=0.0.4; charset=utf-8")

    def events(namespace: str, watch: bool, resource_version: str, timeout_s: int) -> Any:
        if not watch:
            return live.events.listing(namespace)
        try:
            since = int(resource_version or live.events.version)
        except ValueError as exc:
            raise HTTPException(400, f"resourceVersion {resource_version[:30]!r} is not a number") from exc
        body = live.events.watch(since, namespace, float(min(max(timeout_s, 1), 3600)), stop)
        return StreamingResponse(body, media_type="application/json")

    @app.get("/api/v1/events")
    def all_events(
        watch: bool = False,
        resource_version: str = Query("", alias="resourceVersion"),
        timeout_seconds: int = Query(300, alias="timeoutSeconds"),
    ) -> Any:
        return events("", watch, resource_version, timeout_seconds)

    @app.get("/api/v1/namespaces/{namespace}/events")
    def namespaced_events(
        namespace: str,
        watch: bool = False,
        resource_version: str = Query("", alias="resourceVersion"),
        timeout_seconds: int = Query(300, alias="timeoutSeconds"),
    ) -> Any:
        return events(namespace, watch, resource_version, timeout_seconds)

    @app.get("/live")
    def live_status() -> dict[str, Any]:
        return {
            "t": live.now(),
            "epoch": live.sim.epoch,
            "speed": live.speed,
            "finished": live.finished.is_set(),
            "score": float(live.sim.last_stats.get("score", 1.0)),
            **vars(live.stats),
        }

    app.mount("/", control)
    return app


def kubeconfig(server: str, token: str | None) -> str:
    """A kubeconfig pointing ``medic ingest watch-k8s`` (any Kubernetes client) at the simulation."""
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "clustermedic-sim", "cluster": {"server": server}}],
        "users": [{"name": "clustermedic-sim", "user": user}],
        "contexts": [
            {"name": "clustermedic-sim", "context": {"cluster": "clustermedic-sim", "user": "clustermedic-sim"}}
        ],
        "current-context": "clustermedic-sim",
    }
    return json.dumps(config, indent=2) + "\n"  # JSON is YAML: every kubeconfig reader takes it


def bind(host: str, port: int) -> Any:
    """A listening socket, or a one-line error naming the address.

    Raises:
        ConfigError: the port is in use, or the address cannot be bound here.
    """
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use: stop what listens there or pass --port") from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
