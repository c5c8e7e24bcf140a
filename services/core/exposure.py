"""Who may reach a listener: the one rule for binding an HTTP service, and the bearer-token check.

Every ClusterMedic HTTP service that accepts writes (the ingest receivers, the HTTP API, the simulator
control API) asks :func:`check_listener` before it binds:

* on a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) it may run without a token: only
  processes on the same host can reach it;
* anywhere else (``0.0.0.0``, ``::``, a routable address, or a host name, which may resolve to one)
  it needs a token, or the operator's explicit ``--insecure``; then it logs a warning and exports
  ``clustermedic_insecure_listener{role=...} 1`` on its ``/metrics``, so the exposure is visible
  wherever the service is scraped.

With a token set, every route except ``/healthz`` and ``/metrics`` needs ``Authorization: Bearer
<token>``, compared in constant time (:func:`bearer_matches`, :class:`BearerAuth`). The HTTP API goes
further (services/auth): every route needs a token of a role, whatever the address, and its stored
tokens count as credentials here (``check_listener(credentials=...)``).

Errors (under ``ConfigError`` in the tree of ``services/core/errors.py``)::

    ConfigError
    └── UnsafeListener     a non-loopback address without a token and without --insecure
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from services.core.errors import ConfigError

log = logging.getLogger(__name__)

# Routes a scraper or a liveness probe must reach without a credential; they change nothing.
OPEN_PATHS: frozenset[str] = frozenset({"/healthz", "/metrics"})


class UnsafeListener(ConfigError):
    """A service was asked to listen on a non-loopback address without a token or ``--insecure``."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine.

    Host names other than ``localhost`` count as exposed: they may resolve to any address, and
    resolving them here would make the rule depend on DNS at start time.
    """
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is IPv4 loopback; Python 3.11 says otherwise
    return address.is_loopback


@dataclass(frozen=True)
class Listener:
    """The outcome of :func:`check_listener`: where a service listens and how it is guarded.

    Attributes:
        role: the service (``ingest``, ``api``, ``simulator``): the gauge's ``role`` label.
        host: the listen address.
        port: the listen port.
        token: the bearer token every non-open route requires, or None.
        insecure: listening on a non-loopback address without a token (``--insecure`` was given).
    """

    role: str
    host: str
    port: int
    token: str | None = None
    insecure: bool = False

    @property
    def address(self) -> str:
        """``host:port``, with brackets around an IPv6 address."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check_listener(
    role: str,
    host: str,
    port: int,
    *,
    token: str | None,
    token_variable: str,
    insecure: bool = False,
    credentials: int = 0,
    unguarded: str = "anyone who can reach it can use it",
) -> Listener:
    """Decide whether a service may listen on ``host:port``; the one rule every HTTP entrypoint uses.

    Args:
        role: the service, for the message and the gauge.
        host: the listen address.
        port: the listen port.
        token: the configured bearer token (empty counts as unset).
        token_variable: the environment variable that sets it, named in the refusal.
        insecure: the operator's explicit ``--insecure``.
        credentials: other credentials the service checks, each as good as a token (the API's
            stored tokens, services/auth).
        unguarded: what the ``--insecure`` warning says follows from listening without any.

    Returns:
        The listener; ``insecure`` is True only when it is exposed without a token or credential.

    Raises:
        UnsafeListener: a non-loopback address, no token or credential, and no ``--insecure``.
    """
    listener = Listener(role, host, port, token or None)
    if listener.token or credentials > 0 or is_loopback(host):
        return listener
    if not insecure:
        raise UnsafeListener(
            f"refusing to listen on {listener.address} without {token_variable}; set a token or pass --insecure"
        )
    log.warning("%s listens on %s WITHOUT a token (--insecure): %s", role, listener.address, unguarded)
    return Listener(role, host, port, None, insecure=True)


def export_listener(listener: Listener, registry: CollectorRegistry) -> Gauge:
    """Register ``clustermedic_insecure_listener{role}`` in ``registry``: 1 when exposed without a token."""
    gauge = Gauge(
        "clustermedic_insecure_listener",
        "1 when this service listens on a non-loopback address without a token (--insecure)",
        ["role"],
        registry=registry,
    )
    gauge.labels(listener.role).set(1 if listener.insecure else 0)
    return gauge


def bearer_token(authorization: str) -> str | None:
    """The token an ``Authorization: Bearer <token>`` header carries, else None."""
    scheme, _, given = authorization.partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time comparison)."""
    scheme, _, given = authorization.partition(" ")
    # compare even when the scheme is wrong, so the answer time says nothing about the token
    same = hmac.compare_digest(given.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and same


class BearerAuth:
    """ASGI middleware: every HTTP route outside ``open_paths`` needs ``Authorization: Bearer <token>``.

    A request without the right token gets 401 with ``WWW-Authenticate: Bearer`` and a JSON body
    ``{"detail": ...}`` (FastAPI's error shape) naming the variable that sets the token.

    Args:
        app: the wrapped application.
        token: the required token.
        token_variable: named in the 401 message.
        open_paths: paths served without a token.
    """

    def __init__(
        self, app: ASGIApp, *, token: str, token_variable: str, open_paths: Collection[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        self.token = token
        self.open_paths = frozenset(open_paths)
        self.message = json.dumps(
            {"detail": f"missing or wrong bearer token: send Authorization: Bearer <{token_variable}>"}
        ).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 401 or pass the request on."""
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if bearer_matches(authorization, self.token):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(self.message)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.message})
