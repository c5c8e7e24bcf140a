"""The notifier interface: render a message for one vendor, send it, and say whether a failure may pass.

The contract every notifier keeps (Alertmanager's: the notifier, not the caller, knows whether to retry):

* :meth:`Notifier.send` delivers one :class:`Message` and returns a :class:`DeliveryResult`;
* it raises :class:`~services.notify.errors.RetryableDelivery` when trying again may work (HTTP 429,
  5xx, timeouts and connection errors, a vendor's rate-limit answer), carrying ``retry_after`` when the
  vendor sent ``Retry-After``;
* it raises :class:`~services.notify.errors.PermanentDelivery` when it cannot (any other 4xx, a
  vendor-level rejection, a payload still too large after truncation, an unusable config);
* it never raises anything else on purpose, and it never retries by itself: the Celery task owns retries.

Rendering is done by pure functions, one module per vendor under :mod:`services.notify.render`.
"""

from __future__ import annotations

import email.utils
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict

from services.alerting.notification import Notification
from services.core.events import Diagnosis, RemediationEvent
from services.notify.config import NotifySettings
from services.notify.errors import NotifierConfigError, PayloadTooLarge, PermanentDelivery, RetryableDelivery
from services.notify.threads import ThreadStore

USER_AGENT = "ClusterMedic-notify/0.1"


class Message(BaseModel):
    """What a notifier delivers: the correlation engine's decision plus optional context.

    Attributes:
        notification: the group's alerts, the receiver and why it is notified.
        diagnosis: the incident's diagnosis, when one is known.
        remediation: the latest remediation event of the incident, when there is one.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    notification: Notification
    diagnosis: Diagnosis | None = None
    remediation: RemediationEvent | None = None


class DeliveryResult(BaseModel):
    """What one delivery did.

    Attributes:
        notifier: registry name of the notifier.
        receiver: receiver name from routing.yaml.
        status_code: HTTP status of the last request.
        requests: HTTP requests made (a Slack thread update may take two).
        external_id: the vendor's handle: Slack message ``ts``, PagerDuty ``dedup_key``.
        truncated: alerts left out to fit the vendor's limits.
        skipped: why nothing was sent (duplicate, nothing left after ``send_resolved``), else empty.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    notifier: str
    receiver: str
    status_code: int | None = None
    requests: int = 0
    external_id: str = ""
    truncated: int = 0
    skipped: str = ""


@dataclass(frozen=True)
class NotifyContext:
    """What notifiers share in one process.

    Attributes:
        settings: the notify settings.
        http: the HTTP client (tests pass one with ``httpx.MockTransport``).
        threads: where Slack thread parents are kept; required by the Slack app notifier only.
        global_config: routing.yaml's ``global`` block (``slack_api_url``, ``pagerduty_url``...).
    """

    settings: NotifySettings
    http: httpx.Client
    threads: ThreadStore | None = None
    global_config: Mapping[str, Any] = field(default_factory=dict)


class Notifier(ABC):
    """Base of every notifier (see the module docstring for the contract).

    Args:
        config: one entry of a receiver's ``*_configs`` list from routing.yaml, as written.
        context: the shared HTTP client, settings and stores.

    Raises:
        NotifierConfigError: the config lacks what the notifier needs.
    """

    name: ClassVar[str] = ""
    # the routing.yaml receiver key whose entries this notifier delivers (``slack_configs``...): the one
    # place a notifier's kind is written; services.notify.registry.notifier_for is derived from it
    config_kind: ClassVar[str] = ""

    @classmethod
    def serves(cls, config: Mapping[str, Any]) -> bool:
        """Whether this notifier delivers ``config``, one entry of its :attr:`config_kind`.

        Only notifiers that share a kind override it, so that exactly one of them serves each entry
        (Slack: the incoming webhook, or the Web API when the entry has an app token).
        """
        return True

    def __init__(self, config: Mapping[str, Any], context: NotifyContext) -> None:
        self.config = dict(config)
        self.context = context

    @property
    def settings(self) -> NotifySettings:
        """The notify settings."""
        return self.context.settings

    @abstractmethod
    def send(self, message: Message) -> DeliveryResult:
        """Deliver ``message``.

        Raises:
            RetryableDelivery: try again later (``retry_after`` seconds when the vendor said).
            PermanentDelivery: retrying cannot help.
        """

    # ------------------------------------------------------------------------------- helpers

    def secret(self, key: str, *, default: str | None = None) -> str:
        """The config's ``key``, or the content of the file ``<key>_file`` names (see :func:`read_secret`)."""
        return read_secret(self.config, key, who=self.name, default=default)

    def post_json(
        self, url: str, body: Any, *, headers: Mapping[str, str] | None = None, max_bytes: int | None = None
    ) -> httpx.Response:
        """POST ``body`` as JSON and classify the answer.

        Returns:
            The 2xx response.

        Raises:
            PayloadTooLarge: the encoded body is over ``max_bytes``, or the server answered 413.
            RetryableDelivery: transport error, timeout, 408, 429 or 5xx.
            PermanentDelivery: any other non-2xx answer.
        """
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        if max_bytes is not None and len(raw) > max_bytes:
            raise PayloadTooLarge(f"{self.name}: body is {len(raw)} bytes, over the {max_bytes}-byte limit")
        sent = {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT, **(headers or {})}
        try:
            response = self.context.http.post(url, content=raw, headers=sent, timeout=self.settings.timeout_s)
        except httpx.TransportError as exc:
            # timeouts, refused connections, resets: the vendor never answered
            raise RetryableDelivery(f"{self.name}: {type(exc).__name__} posting to {_host(url)}: {exc}") from exc
        classify(response, self.name)
        return response


def read_secret(config: Mapping[str, Any], key: str, *, who: str, default: str | None = None) -> str:
    """The value of ``key`` in ``config``, or the stripped content of the file ``<key>_file`` names.

    Secrets are read at delivery time, in the worker, so they never travel through the broker.

    Raises:
        NotifierConfigError: neither is set (and no default), or the file cannot be read.
    """
    value = config.get(key)
    if value:
        return str(value)
    path = config.get(f"{key}_file")
    if path:
        try:
            return Path(str(path)).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise NotifierConfigError(f"{who}: cannot read {key}_file {path!r}: {exc}") from exc
    if default:
        return default
    raise NotifierConfigError(f"{who}: the config needs {key} or {key}_file")


def classify(response: httpx.Response, who: str) -> None:
    """Raise the delivery error an HTTP answer means; return quietly on 2xx.

    Raises:
        PayloadTooLarge: 413.
        RetryableDelivery: 408, 429 and 5xx, with the ``Retry-After`` it carried.
        PermanentDelivery: any other status outside 2xx.
    """
    code = response.status_code
    if 200 <= code < 300:
        return
    detail = f"{who}: HTTP {code} from {_host(str(response.request.url))}: {response.text[:300]!r}"
    if code in (408, 429) or code >= 500:
        raise RetryableDelivery(detail, status_code=code, retry_after=retry_after(response.headers.get("Retry-After")))
    if code == 413:
        raise PayloadTooLarge(detail, status_code=code)
    raise PermanentDelivery(detail, status_code=code)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _host(url: str) -> str:
    # never log a full webhook URL: Slack's and many others carry the secret in the path
    try:
        return httpx.URL(url).host or "?"
    except httpx.InvalidURL:
        return "?"
