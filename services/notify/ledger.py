"""The delivery ledger: each notification reaches each integration at most once.

A redelivered Celery message (a worker died after sending, a duplicate ``enqueue``) must not post
twice. Every delivery has an idempotency key (:func:`idempotency_key`); its Redis value says where the
delivery stands:

``sending|<owner>``  an attempt holds it, for ``claim_lease_s`` (if that worker dies, the lease lapses)
``retry|<owner>``    the attempt failed retryably; only the retry ``<owner>`` names may take it
``delivered|...``    done; kept for ``dedup_ttl_s``: every later copy is skipped
``failed|...``       refused for good (or out of retries); kept too, so copies do not hammer the vendor

``<owner>`` is ``<task id>:<retry number>``: a retry of the same task carries the next number, a
redelivered copy of an attempt carries the same one, which is how the two are told apart. Claims are
one Lua script, so two workers cannot both take a key.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import redis

from services.alerting.notification import Notification

ClaimOutcome = Literal["claimed", "delivered", "failed", "busy"]

_CLAIM = """
local v = redis.call('GET', KEYS[1])
if (not v) or v == 'retry|' .. ARGV[1] then
  redis.call('SET', KEYS[1], 'sending|' .. ARGV[1], 'EX', ARGV[2])
  return 'claimed'
end
return v
"""
# Compare-and-set: only the owner of the claim moves it on.
_SETTLE = """
local v = redis.call('GET', KEYS[1])
if (not v) or v == 'sending|' .. ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""


def idempotency_key(notification: Notification, integration: str, event: str = "") -> str:
    """The key of one notification to one integration of its receiver.

    Made of the receiver, the integration (``<notifier>#<index in the receiver>``), the incident, the
    group, the reason and the decision's timestamp: the engine emits each decision once, so equal keys
    mean a copy of the same decision. ``event`` names the message that caused a notifier decision (a
    digest of the diagnosis or remediation event): several can share an incident and a timestamp.
    """
    n = notification
    parts: tuple[str, ...] = (n.receiver, integration, n.incident_id, n.group_key, n.reason, repr(float(n.ts)))
    if event:
        parts += (event,)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


class DeliveryLedger:
    """Idempotency keys in Redis.

    Args:
        client: a redis-py client (``decode_responses`` either way).
        dedup_ttl_s: how long a settled delivery is remembered.
        claim_lease_s: how long an attempt holds its key.
        prefix: key prefix.
    """

    def __init__(
        self, client: redis.Redis, *, dedup_ttl_s: int, claim_lease_s: int, prefix: str = "clustermedic:notify:"
    ) -> None:
        self._redis = client
        self._dedup_ttl = dedup_ttl_s
        self._lease = claim_lease_s
        self._prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._settle = client.register_script(_SETTLE)

    def _key(self, key: str) -> str:
        return f"{self._prefix}delivery:{key}"

    def claim(self, key: str, owner: str) -> ClaimOutcome:
        """Take the key for one attempt.

        Returns:
            ``claimed`` (go ahead), ``delivered`` or ``failed`` (settled: skip), or ``busy`` (another
            attempt holds it, or a retry other than ``owner`` is due).
        """
        value = _text(self._claim(keys=[self._key(key)], args=[owner, self._lease]))
        if value == "claimed":
            return "claimed"
        state = value.partition("|")[0]
        return state if state in ("delivered", "failed") else "busy"  # type: ignore[return-value]

    def delivered(self, key: str, owner: str, detail: str = "") -> bool:
        """Mark the key delivered; False when ``owner`` had lost the claim."""
        return self._set(key, owner, f"delivered|{owner}|{detail}", self._dedup_ttl)

    def failed(self, key: str, owner: str, detail: str = "") -> bool:
        """Mark the key refused for good; False when ``owner`` had lost the claim."""
        return self._set(key, owner, f"failed|{owner}|{detail[:500]}", self._dedup_ttl)

    def retry(self, key: str, owner: str, next_owner: str, countdown_s: float) -> bool:
        """Hand the key to the retry ``next_owner``; held until a little after it is due."""
        return self._set(key, owner, f"retry|{next_owner}", int(countdown_s) + self._lease)

    def state(self, key: str) -> str | None:
        """The raw value of the key (tests and debugging)."""
        raw = self._redis.get(self._key(key))
        return None if raw is None else _text(raw)

    def _set(self, key: str, owner: str, value: str, ttl: int) -> bool:
        return bool(self._settle(keys=[self._key(key)], args=[owner, value, max(1, ttl)]))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
