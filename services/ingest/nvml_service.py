"""``medic ingest nvml``: read the GPUs every interval, serve ``/metrics`` and publish to Kafka.

The loop reads through :class:`services.ingest.nvml.NvmlCollector`. Each reading replaces what
``/metrics`` serves (a scrape never triggers an NVML read, so a busy Prometheus cannot slow the
driver down) and, when publishing is on, becomes metric batches on ``telemetry.metrics.v1`` keyed by
GPU UUID, exactly like DCGM samples that arrive through remote_write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from services.core.events import MetricBatch
from services.core.settings import Settings
from services.ingest.normalise import metric_batches
from services.ingest.nvml import NvmlCollector, exposition, series

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exposition:
    """The latest reading as exposition text, shared between the reading loop and the HTTP server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body = b""

    def set(self, text: str) -> None:
        with self._lock:
            self._body = text.encode()

    def get(self) -> bytes:
        with self._lock:
            return self._body


def serve_metrics(listen: str, latest: Exposition) -> ThreadingHTTPServer:
    """Start a daemon HTTP server answering ``GET /metrics`` (and ``/healthz``) at ``host:port``."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"listen address must be host:port, got {listen!r}")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                body, status = latest.get(), 200
            elif self.path == "/healthz":
                body, status = b"ok\n", 200
            else:
                body, status = b"not found: try /metrics\n", 404
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metrics request: " + format, *args)

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="nvml-metrics", daemon=True).start()
    return server


def run(
    settings: Settings,
    collector: NvmlCollector,
    *,
    publish: Callable[[list[MetricBatch]], None] | None,
    latest: Exposition,
    stop: threading.Event,
    readings: int | None = None,
) -> int:
    """Read every ``ingest_nvml_interval_s`` until ``stop`` is set (or ``readings`` were taken).

    Returns how many readings were taken. A reading that fails is logged and skipped; the loop goes on.
    """
    taken = 0
    while not stop.is_set() and (readings is None or taken < readings):
        started = time.monotonic()
        try:
            samples = collector.collect()
        except Exception:
            log.exception("NVML reading failed; trying again next interval")
        else:
            latest.set(exposition(samples))
            if publish is not None:
                batches, _ = metric_batches(
                    series(samples), source="nvml", max_samples=settings.ingest_max_samples_per_batch
                )
                publish(batches)
            taken += 1
            if taken == 1 and collector.unsupported:
                for uuid, fields in collector.unsupported.items():
                    log.info("%s does not support %s", uuid, ", ".join(fields))
        stop.wait(max(0.0, settings.ingest_nvml_interval_s - (time.monotonic() - started)))
    return taken
