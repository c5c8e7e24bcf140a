"""A bounded, expiring set of keys already delivered: how redeliveries become no-ops."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class DeliveredKeys:
    """Remembers keys for ``ttl_s`` seconds, at most ``capacity`` of them (oldest forgotten first).

    A key is *reserved* before its events are published and *released* if publishing fails, so a
    concurrent redelivery (two Alertmanager HA peers) is skipped while the first is in flight, and a
    failed delivery can be retried.

    Args:
        ttl_s: how long a key is remembered.
        capacity: most keys remembered; memory stays bounded whatever the senders do.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, ttl_s: float, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def __contains__(self, key: object) -> bool:
        self._expire()
        return key in self._expiry

    def reserve(self, key: str) -> bool:
        """Record ``key``; False when it is already remembered (a redelivery)."""
        self._expire()
        if key in self._expiry:
            return False
        self._expiry[key] = self._clock() + self._ttl_s
        while len(self._expiry) > self._capacity:
            self._expiry.popitem(last=False)
        return True

    def release(self, key: str) -> None:
        """Forget ``key`` (its delivery failed and will be retried)."""
        self._expiry.pop(key, None)

    def _expire(self) -> None:
        now = self._clock()
        # every key has the same TTL, so insertion order is expiry order
        while self._expiry:
            key, expires = next(iter(self._expiry.items()))
            if expires > now:
                break
            del self._expiry[key]
