"""Where the Slack thread of each incident is kept: one parent message per incident and channel.

The first message about an incident is the thread parent; its ``ts`` (and the channel id Slack
answered with) is kept here under the incident id, so every later notification replies in the thread
and a status change edits the parent. The Redis store is the real one; the in-memory one is for tests
and single-process tools.
"""

from __future__ import annotations

import json
import threading
from typing import Protocol

import redis
from pydantic import BaseModel, ConfigDict


class ThreadRecord(BaseModel):
    """The parent message of an incident's thread.

    Attributes:
        channel: the channel id Slack answered with.
        ts: the parent message's ``ts``.
        status: the status the parent shows (``firing`` / ``resolved``).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    channel: str
    ts: str
    status: str


class ThreadStore(Protocol):
    """Keeps thread parents by (channel as configured, incident id)."""

    def get(self, channel: str, incident: str) -> ThreadRecord | None:
        """The incident's thread parent in that channel, if any."""
        ...

    def create(self, channel: str, incident: str, record: ThreadRecord) -> bool:
        """Store the parent unless one exists; True when this call stored it."""
        ...

    def set_status(self, channel: str, incident: str, record: ThreadRecord) -> None:
        """Overwrite the record (after the parent was edited)."""
        ...


class RedisThreadStore:
    """Thread parents in Redis, one JSON string per incident, expiring after ``ttl_s``.

    Args:
        client: a redis-py client.
        ttl_s: seconds a thread is remembered (refreshed on every write).
        prefix: key prefix.
    """

    def __init__(self, client: redis.Redis, ttl_s: int, prefix: str = "clustermedic:notify:") -> None:
        self._redis = client
        self._ttl = ttl_s
        self._prefix = prefix

    def _key(self, channel: str, incident: str) -> str:
        return f"{self._prefix}slack-thread:{channel}:{incident}"

    def get(self, channel: str, incident: str) -> ThreadRecord | None:
        """The incident's thread parent in that channel, if any."""
        raw = self._redis.get(self._key(channel, incident))
        return ThreadRecord.model_validate(json.loads(raw)) if raw else None

    def create(self, channel: str, incident: str, record: ThreadRecord) -> bool:
        """Store the parent unless one exists (SET NX); True when this call stored it."""
        return bool(self._redis.set(self._key(channel, incident), record.model_dump_json(), nx=True, ex=self._ttl))

    def set_status(self, channel: str, incident: str, record: ThreadRecord) -> None:
        """Overwrite the record and refresh its expiry."""
        self._redis.set(self._key(channel, incident), record.model_dump_json(), ex=self._ttl)


class MemoryThreadStore:
    """Thread parents in a dict (tests, one-off tools)."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], ThreadRecord] = {}
        self._lock = threading.Lock()

    def get(self, channel: str, incident: str) -> ThreadRecord | None:
        """The incident's thread parent in that channel, if any."""
        return self._records.get((channel, incident))

    def create(self, channel: str, incident: str, record: ThreadRecord) -> bool:
        """Store the parent unless one exists; True when this call stored it."""
        with self._lock:
            if (channel, incident) in self._records:
                return False
            self._records[(channel, incident)] = record
            return True

    def set_status(self, channel: str, incident: str, record: ThreadRecord) -> None:
        """Overwrite the record."""
        self._records[(channel, incident)] = record
