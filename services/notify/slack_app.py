"""Slack app (Web API): one thread per incident with ``chat.postMessage`` and ``chat.update``.

Config (a ``slack_configs`` entry): ``app_token`` or ``app_token_file`` (a bot token, ``xoxb-...``,
sent as ``Authorization: Bearer``), ``channel`` (name or id), optional ``app_url`` (the
``chat.postMessage`` URL; ``chat.update`` is its sibling), ``send_resolved``.

The first notification of an incident posts the thread parent and keeps its ``ts`` (Redis, by incident
id). Later ones reply with ``thread_ts``; when the incident's status changed (firing -> resolved, or
back), the parent is first edited with ``chat.update`` so the channel shows the current state.

Slack answers HTTP 200 even for failures: ``{"ok": false, "error": "..."}``. ``ratelimited`` (also
sent as HTTP 429 with ``Retry-After``) and Slack's own transient errors are retryable; every other
error (``channel_not_found``, ``invalid_auth``, ``invalid_blocks``...) is permanent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.notify.base import DeliveryResult, Message, Notifier, retry_after
from services.notify.errors import NotifierConfigError, PermanentDelivery, RetryableDelivery
from services.notify.render import slack
from services.notify.render.pagerduty import dedup_key
from services.notify.slack_webhook import has_app_token
from services.notify.threads import ThreadRecord

RETRYABLE_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"})


class SlackAppNotifier(Notifier):
    """Posts and threads Block Kit messages through Slack's Web API."""

    name = "slack_app"
    config_kind = "slack_configs"

    @classmethod
    def serves(cls, config: Mapping[str, Any]) -> bool:
        """A ``slack_configs`` entry with ``app_token`` / ``app_token_file`` uses the Web API (threads)."""
        return has_app_token(config)

    def _urls(self) -> tuple[str, str]:
        post = str(self.config.get("app_url") or f"{self.settings.slack_api_base.rstrip('/')}/chat.postMessage")
        base = post.rsplit("/", 1)[0] if post.endswith("chat.postMessage") else self.settings.slack_api_base
        return post, f"{base.rstrip('/')}/chat.update"

    def call(self, url: str, body: dict[str, Any], token: str) -> dict[str, Any]:
        """Call one Web API method and return its answer when ``ok``.

        Raises:
            RetryableDelivery: HTTP 429/5xx, a transport error, or a retryable Slack error.
            PermanentDelivery: any other HTTP or Slack error.
        """
        response = self.post_json(url, body, headers={"Authorization": f"Bearer {token}"})
        try:
            answer = response.json()
        except ValueError:
            raise RetryableDelivery(f"{self.name}: Slack answered non-JSON: {response.text[:200]!r}") from None
        if not isinstance(answer, dict):
            raise PermanentDelivery(f"{self.name}: unexpected Slack answer {answer!r}"[:300])
        if answer.get("ok") is True:
            return answer
        error = str(answer.get("error") or "unknown_error")
        detail = f"{self.name}: {url.rsplit('/', 1)[-1]} failed: {error}"
        if error in RETRYABLE_ERRORS:
            raise RetryableDelivery(
                detail, status_code=response.status_code, retry_after=retry_after(response.headers.get("Retry-After"))
            )
        raise PermanentDelivery(detail, status_code=response.status_code)

    def send(self, message: Message) -> DeliveryResult:
        """Post the thread parent, or update it and reply in its thread (contract on the base class)."""
        channel = str(self.config.get("channel") or "")
        if not channel:
            raise NotifierConfigError(f"{self.name}: the config needs channel")
        threads = self.context.threads
        if threads is None:
            raise NotifierConfigError(f"{self.name}: no thread store configured")
        token = self.secret("app_token")
        post_url, update_url = self._urls()
        n = message.notification
        incident = n.incident_id or dedup_key(n)
        rendered = slack.render(
            n, diagnosis=message.diagnosis, remediation=message.remediation, external_url=self.settings.external_url
        )
        parent = threads.get(channel, incident)
        if parent is None:
            answer = self.call(post_url, rendered.post_body(channel), token)
            ts, channel_id = str(answer.get("ts", "")), str(answer.get("channel") or channel)
            # SET NX: if another worker raced us to the parent, its record wins and ours stays a plain message
            threads.create(channel, incident, ThreadRecord(channel=channel_id, ts=ts, status=n.status))
            return DeliveryResult(
                notifier=self.name,
                receiver=n.receiver,
                status_code=200,
                requests=1,
                external_id=ts,
                truncated=rendered.truncated,
            )
        requests = 0
        if parent.status != n.status:
            # Edit the parent before replying: a retry after a failed reply then only replies again.
            self.call(update_url, rendered.update_body(parent.channel, parent.ts), token)
            requests += 1
            threads.set_status(channel, incident, parent.model_copy(update={"status": n.status}))
        answer = self.call(post_url, rendered.post_body(parent.channel, thread_ts=parent.ts), token)
        return DeliveryResult(
            notifier=self.name,
            receiver=n.receiver,
            status_code=200,
            requests=requests + 1,
            external_id=str(answer.get("ts", "")),
            truncated=rendered.truncated,
        )

    def post_in_thread(self, incident_id: str, text: str, blocks: list[dict[str, Any]]) -> DeliveryResult:
        """Post one message about an incident in its thread, or as a new message when it has none.

        What the post-incident report task (services/reports/tasks.py) posts: a summary with a link. It is
        not a notification of the routing tree, so it neither creates the thread nor edits its parent; an
        incident whose thread was never posted (or has expired from the thread store) still gets its
        summary in the channel.

        Args:
            incident_id: the incident whose thread to reply in.
            text: the notification text (shown where blocks are not).
            blocks: Block Kit blocks, within Slack's limits.

        Returns:
            The result, ``external_id`` the message ``ts`` (``requests`` 1).

        Raises:
            NotifierConfigError: no channel or thread store.
            RetryableDelivery, PermanentDelivery: as :meth:`call`.
        """
        channel = str(self.config.get("channel") or "")
        if not channel:
            raise NotifierConfigError(f"{self.name}: the config needs channel")
        threads = self.context.threads
        if threads is None:
            raise NotifierConfigError(f"{self.name}: no thread store configured")
        post_url, _ = self._urls()
        parent = threads.get(channel, incident_id)
        body: dict[str, Any] = {"channel": parent.channel if parent else channel, "text": text, "blocks": blocks}
        if parent is not None:
            body["thread_ts"] = parent.ts
        answer = self.call(post_url, body, self.secret("app_token"))
        return DeliveryResult(
            notifier=self.name, receiver="", status_code=200, requests=1, external_id=str(answer.get("ts", ""))
        )
