"""Silences in PostgreSQL (parametrised SQL only): created and expired through the API and CLI, read
by the correlate agent, which applies them to its engines.

A silence is validated by the engine's own rules (:class:`services.alerting.silences.Silences`)
before it is stored, so what the API accepts the engine can apply. A silence that would mute every
alert (:func:`services.alerting.silences.matches_every_alert`) is refused unless the caller passes
``allow_all`` (``--all`` / ``"all": true``); then its comment records who confirmed it and how, until
the console's roles decide who may. Rows are never deleted; expiring
one sets ``ends_at`` to now (and, for a silence that has not started, ``starts_at`` too, as
Alertmanager does), so the history stays readable.

Errors (under ``StoreError`` in the tree of ``services/core/errors.py``; invalid silences raise the
engine's ``SilenceError``)::

    StoreError
    └── SilenceNotFound      no silence with this id
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict

from services.alerting.errors import SilenceError
from services.alerting.silences import Silence, Silences, SilenceState, matches_every_alert
from services.core.errors import StoreError

_COLUMNS = "silence_id, matchers, starts_at, ends_at, created_by, comment, created_at, updated_at"
StateFilter = Literal["pending", "active", "expired"]


class SilenceNotFound(StoreError):
    """No stored silence has this id."""


class StoredSilence(BaseModel):
    """One row of ``silences``."""

    model_config = ConfigDict(frozen=True)

    silence_id: str
    matchers: tuple[str, ...]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    updated_at: datetime

    def state(self, now: float) -> SilenceState:
        """``pending``, ``active`` or ``expired`` at UNIX time ``now``."""
        return self.to_silence().state(now)

    def to_silence(self) -> Silence:
        """The engine's silence."""
        return Silence.of(
            self.matchers,
            starts_at=self.starts_at.timestamp(),
            ends_at=self.ends_at.timestamp(),
            created_by=self.created_by,
            comment=self.comment,
            id=self.silence_id,
        )


def _row(row: Sequence[Any]) -> StoredSilence:
    names = [c.strip() for c in _COLUMNS.split(",")]
    return StoredSilence(**dict(zip(names, row, strict=True)))


def _at(ts: float) -> datetime:
    # PostgreSQL keeps microseconds; truncate rather than round so a silence that starts "now" is
    # never stored a fraction of a microsecond in the future (and so read back as pending)
    return datetime.fromtimestamp(math.floor(ts * 1_000_000) / 1_000_000, UTC)


def create_silence(
    conn: psycopg.Connection,
    *,
    matchers: Sequence[str],
    starts_at: float,
    ends_at: float,
    created_by: str,
    comment: str = "",
    silence_id: str | None = None,
    allow_all: bool = False,
    via: str = "api",
) -> StoredSilence:
    """Validate and store a new silence; return it.

    Args:
        conn: the database connection.
        matchers: matcher strings such as ``'node="gpu-node-3"'``.
        starts_at: UNIX seconds when it starts muting.
        ends_at: UNIX seconds when it stops.
        created_by: who asks for it.
        comment: why.
        silence_id: default: a new random id.
        allow_all: the caller confirmed that the silence may mute every alert.
        via: how the caller asked (``api``, ``cli``), recorded with a confirmed mute-all.

    Raises:
        SilenceError: a matcher does not parse, the silence would mute every alert without
            ``allow_all``, every matcher matches the empty string, or it ends before it starts.
    """
    silence = Silence.of(
        matchers,
        starts_at=starts_at,
        ends_at=ends_at,
        created_by=created_by,
        comment=comment,
        id=silence_id or f"sil-{uuid.uuid4().hex}",
    )
    if matches_every_alert(silence.matchers):
        if not allow_all:
            shown = ", ".join(str(m) for m in silence.matchers)
            raise SilenceError(
                f"silence {{{shown}}} would mute every alert; narrow its matchers, or confirm with"
                ' --all (medic silences add) / "all": true (API)'
            )
        # recorded in the row itself, so whoever reads the silence sees it was meant to mute everything
        note = f"[mutes every alert: confirmed by {created_by} via {via} (--all)]"
        comment = f"{comment} {note}" if comment else note
        silence = replace(silence, comment=comment)
    Silences().add(silence)  # the engine's validation, so the engine can apply what is stored
    row = conn.execute(
        f"INSERT INTO silences (silence_id, matchers, starts_at, ends_at, created_by, comment)"
        f" VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
        (
            silence.id,
            Jsonb([str(m) for m in silence.matchers]),
            _at(starts_at),
            _at(ends_at),
            created_by,
            comment,
        ),
    ).fetchone()
    if not conn.autocommit:
        conn.commit()
    assert row is not None
    return _row(row)


def get_silence(conn: psycopg.Connection, silence_id: str) -> StoredSilence:
    """The silence with this id.

    Raises:
        SilenceNotFound: no such silence.
    """
    row = conn.execute(f"SELECT {_COLUMNS} FROM silences WHERE silence_id = %s", (silence_id,)).fetchone()
    if row is None:
        raise SilenceNotFound(f"no silence with id {silence_id!r}")
    return _row(row)


def list_silences(
    conn: psycopg.Connection, *, now: float, state: StateFilter | None = None, limit: int = 1000
) -> list[StoredSilence]:
    """Silences (only those in ``state`` at ``now`` when given), newest start first."""
    at = _at(now)
    where = {
        None: ("TRUE", ()),
        "pending": ("starts_at > %s", (at,)),
        "active": ("starts_at <= %s AND ends_at > %s", (at, at)),
        "expired": ("ends_at <= %s", (at,)),
    }[state]
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM silences WHERE {where[0]} ORDER BY starts_at DESC, silence_id LIMIT %s",
        (*where[1], limit),
    ).fetchall()
    return [_row(r) for r in rows]


def expire_silence(conn: psycopg.Connection, silence_id: str, *, now: float) -> StoredSilence:
    """End a silence at ``now`` (one that has not started ends before it starts); expired ones stay as they are.

    Raises:
        SilenceNotFound: no such silence.
    """
    at = _at(now)
    row = conn.execute(
        f"UPDATE silences SET"
        f" starts_at = CASE WHEN starts_at > %s THEN %s ELSE starts_at END,"
        f" ends_at = %s, updated_at = now()"
        f" WHERE silence_id = %s AND ends_at > %s RETURNING {_COLUMNS}",
        (at, at, at, silence_id, at),
    ).fetchone()
    if not conn.autocommit:
        conn.commit()
    if row is None:
        return get_silence(conn, silence_id)  # already expired, or SilenceNotFound
    return _row(row)


def engine_silences(conn: psycopg.Connection, *, now: float, retention_s: float = 3600.0) -> list[Silence]:
    """The silences an engine should hold: pending, active, and expired within ``retention_s``.

    Rows that no longer validate are skipped (the engine could not apply them anyway).
    """
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM silences WHERE ends_at > %s ORDER BY silence_id", (_at(now - retention_s),)
    ).fetchall()
    if not conn.autocommit:
        conn.commit()  # end the read transaction: the next poll must see new rows
    out = []
    for raw in rows:
        try:
            out.append(_row(raw).to_silence())
        except (SilenceError, ValueError):  # a hand-edited row must not stop the agent
            continue
    return out
