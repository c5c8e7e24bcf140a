"""Telemetry sinks: stdout JSON lines, files, a per-node Prometheus /metrics endpoint, Loki push, Kafka.

A sink takes each step's events (:meth:`emit`) and is closed at the end. :func:`make_sink` builds one
from a short spec string, which is what the CLI passes.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from services.core.errors import ConfigError
from services.core.events import Event, LogRecord, MetricBatch
from services.core.settings import Settings


class NullSink:
    """Drops everything (benchmarks, grading only)."""

    def emit(self, events: list[Event]) -> None:
        """Ignore the events."""

    def close(self) -> None:
        """Nothing to release."""


class MemorySink:
    """Keeps every event in a list (tests)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, events: list[Event]) -> None:
        """Append the events."""
        self.events.extend(events)

    def close(self) -> None:
        """Nothing to release."""


class HashSink:
    """SHA-256 over every event's Kafka bytes: the fingerprint of a run's telemetry."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = 0

    def emit(self, events: list[Event]) -> None:
        """Fold the events' bytes into the digest."""
        for e in events:
            self._h.update(e.topic.encode())
            self._h.update(e.to_bytes())
            self.count += 1

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._h.hexdigest()

    def close(self) -> None:
        """Nothing to release."""


class StdoutSink:
    """One JSON object per line: ``{"topic": ..., "key": ..., "value": {...}}``.

    Args:
        stream: where to write (default ``sys.stdout``).
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout

    def emit(self, events: list[Event]) -> None:
        """Write the events."""
        for e in events:
            self.stream.write(f'{{"topic":"{e.topic}","key":{json.dumps(e.key())},"value":{e.to_bytes().decode()}}}\n')

    def close(self) -> None:
        """Flush the stream."""
        self.stream.flush()


class FileSink(StdoutSink):
    """JSON lines into a file."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("w")
        super().__init__(self._fh)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_exposition(batches: list[MetricBatch], *, timestamps: bool = False) -> str:
    """Prometheus text exposition (format 0.0.4) of the batches' samples, grouped by metric family.

    Args:
        batches: the samples to expose.
        timestamps: append each sample's own time in milliseconds, so a scraper that honours
            timestamps keeps simulated time instead of stamping the scrape's wall-clock time.
    """
    families: dict[str, list[str]] = {}
    for b in batches:
        for s in b.samples:
            family = s.name
            for suffix in ("_bucket", "_sum", "_count"):
                if family.endswith(suffix) and family.startswith("vllm:"):
                    family = family[: -len(suffix)]
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items() if v != "")
            line = f"{s.name}{{{labels}}} {s.value:g}"
            families.setdefault(family, []).append(f"{line} {round(s.ts * 1000)}" if timestamps else line)
    out: list[str] = []
    for family in sorted(families):
        if family.startswith("vllm:") and (family.endswith("_seconds")):
            kind = "histogram"
        elif family.endswith("_total"):
            kind = "counter"
        else:
            kind = "gauge"
        out.append(f"# TYPE {family} {kind}")
        out.extend(families[family])
    return "\n".join(out) + "\n"


class PrometheusSink:
    """One ``/metrics`` HTTP endpoint per simulated node (DCGM + vLLM series of that node).

    Node ``i`` listens on ``port_base + i`` of ``host``; :attr:`ports` maps node name to port.

    Args:
        node_of: function mapping an entity (GPU UUID / pod) to its node name ("" when unknown).
        nodes: node names.
        host: bind address.
        port_base: first port (0: let the OS pick one per node).
    """

    def __init__(self, node_of: Any, nodes: list[str], host: str = "127.0.0.1", port_base: int = 0) -> None:
        self._node_of = node_of
        self._latest: dict[str, dict[str, MetricBatch]] = {n: {} for n in nodes}
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self.ports: dict[str, int] = {}
        sink = self
        for i, name in enumerate(nodes):

            class Handler(BaseHTTPRequestHandler):
                node = name

                def do_GET(self) -> None:
                    if self.path.split("?")[0] != "/metrics":
                        self.send_error(404)
                        return
                    body = sink.render(self.node).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, format: str, *args: Any) -> None:
                    return

            server = ThreadingHTTPServer((host, port_base + i if port_base else 0), Handler)
            self.ports[name] = server.server_address[1]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)

    def render(self, node: str) -> str:
        """Current exposition text of one node."""
        with self._lock:
            batches = list(self._latest.get(node, {}).values())
        return render_exposition(batches)

    def emit(self, events: list[Event]) -> None:
        """Keep the latest batch of every entity."""
        with self._lock:
            for e in events:
                if isinstance(e, MetricBatch):
                    node = self._node_of(e.entity)
                    if node in self._latest:
                        self._latest[node][e.entity] = e

    def close(self) -> None:
        """Stop the servers."""
        for s in self._servers:
            s.shutdown()
            s.server_close()


class LokiSink:
    """Pushes log lines to Loki's ``/loki/api/v1/push`` (JSON body), batched per step.

    Args:
        url: Loki base URL or the full push URL.
        client: an ``httpx.Client`` (tests pass one with a MockTransport).
    """

    def __init__(self, url: str, client: Any = None) -> None:
        import httpx

        self.url = url if url.endswith("/loki/api/v1/push") else url.rstrip("/") + "/loki/api/v1/push"
        self.client = client or httpx.Client(timeout=10.0)
        self.pushed = 0

    def emit(self, events: list[Event]) -> None:
        """Group the step's log lines by stream and push them."""
        streams: dict[str, tuple[dict[str, str], list[list[str]]]] = {}
        for e in events:
            if isinstance(e, LogRecord):
                key = json.dumps(e.stream, sort_keys=True)
                streams.setdefault(key, (e.stream, []))[1].append([str(round(e.ts * 1e9)), e.line])
        if not streams:
            return
        body = {"streams": [{"stream": s, "values": v} for s, v in streams.values()]}
        resp = self.client.post(self.url, json=body)
        resp.raise_for_status()
        self.pushed += sum(len(v) for _, v in streams.values())

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


class KafkaSink:
    """Publishes every event to its topic through the project's Kafka publisher.

    Args:
        settings: the process settings (bootstrap servers, topic prefix).
    """

    def __init__(self, settings: Settings) -> None:
        # Imported here so the simulator works without Kafka libraries or a broker.
        from services.core.bus import KafkaPublisher

        self._pub = KafkaPublisher(settings)
        self._pub.__enter__()

    def emit(self, events: list[Event]) -> None:
        """Publish the events."""
        for e in events:
            self._pub.publish(e)

    def close(self) -> None:
        """Flush and close the publisher."""
        self._pub.flush()
        self._pub.__exit__(None, None, None)


def make_sink(spec: str, settings: Settings | None = None, node_of: Any = None, nodes: list[str] | None = None) -> Any:
    """Build a sink from ``stdout``, ``null``, ``hash``, ``file:PATH``, ``prometheus[:PORT]``, ``loki:URL``
    or ``kafka``.

    Raises:
        ConfigError: unknown spec.
    """
    kind, _, arg = spec.partition(":")
    if kind == "stdout":
        return StdoutSink()
    if kind in ("null", "none", ""):
        return NullSink()
    if kind == "hash":
        return HashSink()
    if kind == "file":
        return FileSink(Path(arg))
    if kind == "prometheus":
        return PrometheusSink(node_of, nodes or [], port_base=int(arg) if arg else 9400)
    if kind == "loki":
        return LokiSink(arg or "http://127.0.0.1:3100")
    if kind == "kafka":
        return KafkaSink(settings or Settings())
    raise ConfigError(f"unknown sink {spec!r}: use stdout, null, hash, file:PATH, prometheus[:PORT], loki:URL or kafka")
