"""One connection per API request, and the answer when the database is unreachable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from fastapi import HTTPException

from services.core.errors import InfraError
from services.core.settings import Settings
from services.store.db import connect


@contextmanager
def request_connection(settings: Settings) -> Iterator[psycopg.Connection]:
    """A connection for one request, committed when it ends; 503 when PostgreSQL cannot be reached."""
    try:
        conn = connect(settings)
    except InfraError as exc:
        raise HTTPException(503, f"database unavailable: {exc}") from exc
    with conn:
        yield conn
