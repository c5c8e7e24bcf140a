"""Signed requests seen recently (table ``seen_requests``, migration 0008).

A Slack signature stays valid for five minutes (``services.remediation.slack.MAX_SKEW_S``), so whoever
captured a signed click could send it again within them. :func:`first_sighting` remembers each
signature until it could no longer pass the timestamp check, and says whether this is the first time.
"""

from __future__ import annotations

from typing import Any

import psycopg


def first_sighting(conn: psycopg.Connection[Any], source: str, key: str, *, request_ts: float, keep_s: float) -> bool:
    """Record ``key`` of ``source`` (stamped ``request_ts``, UNIX s); False when it was recorded before.

    Rows stamped more than ``keep_s`` before this one are deleted on the way: by then their signature's
    timestamp is refused anyway.
    """
    with conn.transaction():
        conn.execute(
            "DELETE FROM seen_requests WHERE source = %s AND request_ts < to_timestamp(%s)",
            (source, request_ts - keep_s),
        )
        row = conn.execute(
            """INSERT INTO seen_requests (source, key, request_ts) VALUES (%s, %s, to_timestamp(%s))
               ON CONFLICT DO NOTHING RETURNING key""",
            (source, key, request_ts),
        ).fetchone()
    return row is not None
