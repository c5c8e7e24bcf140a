"""The ingest HTTP service: push receivers for Prometheus, Loki and Alertmanager.

=================================  ============================================================
``POST /api/v1/write``             Prometheus remote_write 1.0 (protobuf + snappy block) -> 204
``POST /loki/api/v1/push``         Loki push: JSON (optionally gzip/deflate) or protobuf + snappy -> 204
``POST /api/v1/alertmanager/webhook``  Alertmanager webhook v4 -> 200, one Anomaly per new alert state
``GET /metrics``                   the service's own Prometheus metrics
``GET /healthz``                   liveness and queue fill
=================================  ============================================================

With ``ingest_token`` set, every push route needs ``Authorization: Bearer <token>`` (401 otherwise);
``/metrics`` and ``/healthz`` stay open. Whether the service may listen without a token is decided
before it binds, by :func:`services.core.exposure.check_listener` (``medic ingest serve``).

Every payload is validated; a bad one gets a 4xx with a plain-text reason and is written to
``deadletter.v1`` before the answer goes out. A payload that does not fit the bounded publish queue,
or whose events Kafka does not acknowledge in time, gets 503 with ``Retry-After``: Prometheus,
Promtail/Alloy and Alertmanager all retry 5xx answers, and none of them is asked to retry a 4xx.
Success is answered only after Kafka acknowledged every event of the payload (at-least-once).

Entries stamped outside the event-time window (``ingest_max_future_s`` ahead of this receiver's
clock, ``ingest_max_age_s`` behind it) are refused one by one, as Loki and Prometheus refuse them:
their valid neighbours are published and acknowledged first, then the refused ones are
dead-lettered and the payload is answered 400 with their count and the bound. The sender does not
retry a 4xx, which is right: the same entries would be refused again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers

from services.core.events import DeadLetter, Event
from services.core.exposure import Listener, bearer_matches, export_listener
from services.core.settings import Settings
from services.ingest import normalise
from services.ingest.dedup import DeliveredKeys
from services.ingest.errors import Overloaded, RejectedInput, Unauthorized
from services.ingest.fastwrite import SeriesCache
from services.ingest.sink import IngestMetrics, Publisher, PublishQueue
from services.ingest.timebounds import TimeCheck

log = logging.getLogger(__name__)

REMOTE_WRITE_PATH = "/api/v1/write"
LOKI_PUSH_PATH = "/loki/api/v1/push"
ALERTMANAGER_PATH = "/api/v1/alertmanager/webhook"


@dataclass
class Parsed:
    """What a receiver made of one payload."""

    events: list[Event]
    items: int
    dropped: int = 0
    duplicates: int = 0
    keys: list[str] = field(default_factory=list)
    check: TimeCheck | None = None
    """The payload's event-time window and what it refused."""


class IngestService:
    """The state behind the HTTP app: settings, the publish queue, metrics and the dedup memory.

    Args:
        settings: limits, token and dedup settings come from here.
        publisher: a KafkaPublisher (or anything with the same publish/flush/close).
    """

    def __init__(self, settings: Settings, publisher: Publisher) -> None:
        self.settings = settings
        self.metrics = IngestMetrics()
        self.queue = PublishQueue(
            publisher,
            self.metrics,
            capacity=settings.ingest_queue_capacity,
            flush_timeout_s=settings.ingest_flush_timeout_s,
            retry_after_s=settings.ingest_retry_after_s,
            max_message_bytes=settings.ingest_max_message_bytes,
        )
        self.delivered = DeliveredKeys(settings.ingest_dedup_ttl_s, settings.ingest_dedup_capacity)
        self.limits = normalise.Limits.of(settings)
        self.series = SeriesCache(
            max_bytes=settings.ingest_series_cache_bytes, max_label_bytes=settings.ingest_max_label_bytes
        )
        self.clock: Callable[[], float] = time.time  # the receiver's wall clock, for the event-time window

    def time_check(self) -> TimeCheck:
        """The event-time window of a payload arriving now."""
        return TimeCheck.of(self.settings, self.clock())

    # ------------------------------------------------------------------ request plumbing

    def authorize(self, request: Request) -> None:
        """Check the bearer token when one is configured.

        Raises:
            Unauthorized: the token is missing or wrong.
        """
        token = self.settings.ingest_token
        if token and not bearer_matches(request.headers.get("authorization", ""), token):
            raise Unauthorized("missing or wrong bearer token: send Authorization: Bearer <CLUSTERMEDIC_INGEST_TOKEN>")

    async def read_body(self, request: Request, sink: bytearray) -> bytes:
        """Read the body into ``sink`` (so a rejection can dead-letter what was read), bounded.

        Raises:
            RejectedInput: 413 when the body is over ``ingest_max_body_bytes``.
        """
        limit = self.settings.ingest_max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            # keep what the dead letter can hold, without reading the rest
            keep = self.settings.ingest_deadletter_max_bytes
            async for chunk in request.stream():
                sink.extend(chunk)
                if len(sink) >= keep:
                    break
            raise RejectedInput(
                f"body of {declared} bytes is over the {limit}-byte limit", status=413, reason="too_large"
            )
        async for chunk in request.stream():
            sink.extend(chunk)
            if len(sink) > limit:
                raise RejectedInput(f"body is over the {limit}-byte limit", status=413, reason="too_large")
        return bytes(sink)

    async def handle(
        self,
        request: Request,
        receiver: str,
        parse: Callable[[bytes, Headers], Parsed],
        success: Callable[[Parsed], Response],
    ) -> Response:
        """Authorize, read, parse, publish and answer; every failure becomes a 4xx or a 503."""
        received_at = time.monotonic()
        body = bytearray()
        try:
            self.authorize(request)
            raw = await self.read_body(request, body)
            try:
                parsed = parse(raw, request.headers)
            except RejectedInput:
                raise
            except Exception as exc:  # a parser bug must not become a 5xx for the sender; it is logged loudly
                log.exception("%s: unexpected error parsing a payload", receiver)
                raise RejectedInput(
                    f"payload could not be processed: {type(exc).__name__}: {exc}", reason="unprocessable"
                ) from exc
        except RejectedInput as exc:
            return await self.reject(request, receiver, bytes(body), exc)
        try:
            await self.queue.submit(parsed.events, received_at=received_at)
        except Overloaded as exc:
            self._release(parsed.keys)
            self.metrics.throttled.labels(receiver).inc()
            self.metrics.requests.labels(receiver, "503").inc()
            return PlainTextResponse(str(exc), status_code=503, headers={"Retry-After": str(exc.retry_after_s)})
        self.metrics.received.labels(receiver).inc(parsed.items)
        if parsed.dropped:
            self.metrics.dropped.labels(receiver).inc(parsed.dropped)
        if parsed.duplicates:
            self.metrics.duplicates.labels(receiver).inc(parsed.duplicates)
        check = parsed.check
        if check is not None and check.refused:
            # the valid entries are in Kafka now; the refused ones get a dead letter and a 400
            self.metrics.out_of_bounds.labels(receiver, "too_new").inc(check.too_new)
            self.metrics.out_of_bounds.labels(receiver, "too_old").inc(check.too_old)
            total = parsed.items + parsed.dropped + parsed.duplicates + check.refused
            refusal = RejectedInput(check.message(total), reason="out_of_bounds")
            keep = self.settings.ingest_deadletter_max_bytes
            return await self.reject(request, receiver, check.deadletter_raw(keep), refusal)
        response = success(parsed)
        self.metrics.requests.labels(receiver, str(response.status_code)).inc()
        return response

    def _release(self, keys: list[str]) -> None:
        for key in keys:
            self.delivered.release(key)

    async def reject(self, request: Request, receiver: str, body: bytes, exc: RejectedInput) -> Response:
        """Dead-letter a rejected payload, then answer its 4xx."""
        keep = self.settings.ingest_deadletter_max_bytes
        error = str(exc) if len(body) <= keep else f"{exc} (dead letter keeps the first {keep} of {len(body)} bytes)"
        letter = DeadLetter.of(
            raw=body[:keep],
            source_topic=f"http:{request.url.path}",
            error=error,
            consumer="ingest",
            ts=time.time(),
            source_key=request.client.host if request.client else "",
        )
        letter = letter.model_copy(update={"error_type": type(exc).__name__})
        if not await self.queue.submit_deadletter(letter):
            log.warning("%s: could not dead-letter a rejected payload (%s)", receiver, exc)
        self.metrics.rejected.labels(receiver, exc.reason).inc()
        self.metrics.requests.labels(receiver, str(exc.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return PlainTextResponse(str(exc), status_code=exc.status, headers=headers)

    # ------------------------------------------------------------------ receivers

    def parse_remote_write(self, body: bytes, headers: Headers) -> Parsed:
        """Check the remote_write 1.0 headers and decode the body."""
        content_type = headers.get("content-type", "application/x-protobuf")
        media, _, params = content_type.partition(";")
        if media.strip().lower() != "application/x-protobuf":
            raise RejectedInput(
                f"Content-Type {content_type!r}: remote_write needs application/x-protobuf",
                status=415,
                reason="media_type",
            )
        proto = _param(params, "proto")
        if proto and proto != "prometheus.WriteRequest":
            raise RejectedInput(
                f"only prometheus.WriteRequest (remote_write 1.0) is accepted, not {proto}",
                status=415,
                reason="media_type",
            )
        encoding = headers.get("content-encoding", "snappy").strip().lower()
        if encoding != "snappy":
            raise RejectedInput(
                f"Content-Encoding {encoding!r}: remote_write needs snappy", status=415, reason="encoding"
            )
        version = headers.get("x-prometheus-remote-write-version", "0.1.0").strip()
        if not version.startswith("0."):
            raise RejectedInput(
                f"remote_write version {version} is not supported (1.0: 0.1.0)", status=415, reason="version"
            )
        check = self.time_check()
        batches, accepted, dropped = normalise.remote_write(
            body,
            max_decompressed=self.settings.ingest_max_decompressed_bytes,
            max_samples=self.settings.ingest_max_samples_per_batch,
            cache=self.series,
            check=check,
            limits=self.limits,
        )
        return Parsed(list(batches), accepted, dropped, check=check)

    def parse_loki(self, body: bytes, headers: Headers) -> Parsed:
        """Decode a Loki push body, JSON or protobuf, as Loki's own push endpoint does."""
        limit = self.settings.ingest_max_decompressed_bytes
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        encoding = headers.get("content-encoding", "").strip().lower()
        check = self.time_check()
        if media in ("application/json", "text/json") or media.endswith("+json"):
            records = normalise.loki_json(normalise.inflate(body, encoding, limit), check, self.limits)
        elif media in ("", "application/x-protobuf", "application/protobuf"):
            outer = "" if encoding == "snappy" else encoding  # the protobuf body is always snappy inside
            records = normalise.loki_protobuf(
                normalise.inflate(body, outer, limit), max_decompressed=limit, check=check, limits=self.limits
            )
        else:
            raise RejectedInput(
                f"Content-Type {media!r}: Loki push takes application/json or application/x-protobuf",
                status=415,
                reason="media_type",
            )
        return Parsed(list(records), len(records), check=check)

    def parse_alertmanager(self, body: bytes, headers: Headers) -> Parsed:
        """Decode a webhook v4 body, keeping only alert states not delivered before."""
        check = self.time_check()
        anomalies = normalise.alertmanager_webhook(body, check, self.limits)
        events: list[Event] = []
        keys: list[str] = []
        for anomaly in anomalies:
            key = anomaly.delivery_key()  # the alert state, not the alert: its resolution is no duplicate
            if self.delivered.reserve(key):
                keys.append(key)
                events.append(anomaly)
        return Parsed(events, len(events), duplicates=len(anomalies) - len(events), keys=keys, check=check)


def _param(params: str, name: str) -> str:
    for part in params.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return ""


def create_app(settings: Settings, publisher: Publisher, *, listener: Listener | None = None) -> FastAPI:
    """Build the ingest HTTP app around a publisher (closed when the app shuts down).

    Args:
        settings: the one Settings object of the process.
        publisher: a :class:`services.core.bus.KafkaPublisher`, or anything with its
            publish/flush/close interface.
        listener: what :func:`services.core.exposure.check_listener` decided for the address the
            app is served on, exported as ``clustermedic_insecure_listener``; default: not exposed.
    """
    service = IngestService(settings, publisher)
    export_listener(
        listener or Listener("ingest", settings.ingest_host, settings.ingest_port, settings.ingest_token),
        service.metrics.registry,
    )
    service.queue.start()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.queue.start()
        yield
        service.queue.stop(settings.ingest_flush_timeout_s)

    app = FastAPI(title="ClusterMedic ingest", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service

    def no_content(parsed: Parsed) -> Response:
        return Response(status_code=204)

    @app.post(REMOTE_WRITE_PATH)
    async def remote_write(request: Request) -> Response:
        """Prometheus remote_write 1.0 receiver."""
        return await service.handle(request, "remote_write", service.parse_remote_write, no_content)

    @app.post(LOKI_PUSH_PATH)
    async def loki_push(request: Request) -> Response:
        """Loki push receiver (JSON, gzip JSON, protobuf + snappy)."""
        return await service.handle(request, "loki_push", service.parse_loki, no_content)

    @app.post(ALERTMANAGER_PATH)
    async def alertmanager(request: Request) -> Response:
        """Alertmanager webhook v4 receiver."""

        def answer(parsed: Parsed) -> Response:
            return JSONResponse({"status": "ok", "accepted": parsed.items, "duplicates": parsed.duplicates})

        return await service.handle(request, "alertmanager", service.parse_alertmanager, answer)

    @app.get("/metrics")
    async def metrics() -> Response:
        """The ingest service's own metrics, in Prometheus text exposition."""
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness, with how full the publish queue is."""
        return JSONResponse(
            {"status": "ok", "queue_weight": service.queue.weight, "queue_capacity": service.queue.capacity}
        )

    return app
