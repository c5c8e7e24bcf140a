"""A local HTTP server for tests that stand in for an API ClusterMedic reads (Kubernetes, an exporter).

Subclass :class:`StubHandler`, answer with :meth:`StubHandler.reply`, and run it with :func:`serving`,
which yields the server's base URL and shuts it down afterwards.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubHandler(BaseHTTPRequestHandler):
    """A quiet request handler with a one-call answer."""

    def reply(self, status: int, body: bytes = b"", content_type: str | None = "application/json") -> None:
        """Answer ``status`` with ``body`` and its length (and no Content-Type when ``content_type`` is None)."""
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port; yield ``http://127.0.0.1:<port>``.

    Request threads are daemons (``ThreadingHTTPServer``'s default): one still blocked on a kept-alive
    connection or a long watch does not hold up the shutdown.
    """
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
