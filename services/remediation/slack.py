"""Slack interactivity for approvals: request signature check, payload parsing, the approval message.

Slack signs each interactivity request: ``X-Slack-Signature: v0=<hex HMAC-SHA256>`` of
``v0:{X-Slack-Request-Timestamp}:{raw body}`` keyed with the app's signing secret. A request older or
newer than five minutes is refused (replay protection).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from services.remediation.errors import SignatureError

MAX_SKEW_S = 300
APPROVE_ACTION = "remediation_approve"
REJECT_ACTION = "remediation_reject"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` value Slack would send for this body."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify_signature(secret: str, timestamp: str | None, body: bytes, signature: str | None, now: float) -> None:
    """Check a Slack request's signature and timestamp.

    Raises:
        SignatureError: no secret configured, a header missing, the timestamp more than five minutes
            from ``now``, or the signature wrong.
    """
    if not secret:
        raise SignatureError("no Slack signing secret configured")
    if not timestamp or not signature:
        raise SignatureError("missing X-Slack-Request-Timestamp or X-Slack-Signature")
    try:
        ts = int(timestamp)
    except ValueError:
        raise SignatureError("X-Slack-Request-Timestamp is not an integer") from None
    if abs(now - ts) > MAX_SKEW_S:
        raise SignatureError(f"request timestamp is {now - ts:.0f} s from now (max {MAX_SKEW_S})")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise SignatureError("bad signature")


class Interaction(NamedTuple):
    """One click on an approval button.

    Attributes:
        action_id: :data:`APPROVE_ACTION` or :data:`REJECT_ACTION`.
        run_id: the run the button is for.
        user_id: the Slack user id (``U024BE7LH``): stable, what RemediationSettings.slack_users maps.
        user_name: the user's name as Slack sent it, for messages only (a user may rename themselves).
    """

    action_id: str
    run_id: str
    user_id: str
    user_name: str


def parse_interaction(body: bytes) -> Interaction:
    """The click in a ``block_actions`` form body.

    Raises:
        SignatureError: the body is not a block_actions payload with one of our buttons and a user id.
    """
    try:
        payload: dict[str, Any] = json.loads(parse_qs(body.decode())["payload"][0])
        action = payload["actions"][0]
        user = payload.get("user", {})
        user_id = str(user.get("id") or "")
        name = str(user.get("username") or user.get("name") or user_id)
        action_id, run_id = str(action["action_id"]), str(action["value"])
    except (KeyError, IndexError, ValueError, UnicodeDecodeError, AttributeError, TypeError) as exc:
        raise SignatureError(f"not a Slack block_actions payload: {exc}") from exc
    if action_id not in (APPROVE_ACTION, REJECT_ACTION) or not user_id:
        raise SignatureError(f"unexpected action {action_id!r} or no user id")
    return Interaction(action_id, run_id, user_id, name)


def approval_blocks(run_id: str, playbook: str, description: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Block Kit blocks asking for approval, with Approve / Reject buttons (3000 chars a section)."""
    text = f"*Approval needed*: `{playbook}` (run `{run_id}`)\n{description}"[:3000]
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{json.dumps(params, sort_keys=True)}```"[:3000]}},
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "action_id": APPROVE_ACTION,
                    "value": run_id,
                },
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Reject"},
                    "style": "danger",
                    "action_id": REJECT_ACTION,
                    "value": run_id,
                },
            ],
        },
    ]
