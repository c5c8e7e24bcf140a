"""Versioned detector models in the ``detector_models`` table (parametrised SQL only)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from services.core.settings import Settings
from services.store.db import connect


@dataclass(frozen=True)
class StoredModel:
    """One row of ``detector_models``."""

    detector: str
    entity_class: str
    version: int
    trained_at: datetime
    training: dict[str, Any]
    threshold: float | None
    model: bytes


def save_model(
    settings: Settings,
    *,
    detector: str,
    entity_class: str,
    model: bytes,
    training: dict[str, Any],
    threshold: float | None,
) -> int:
    """Store a new version of a detector's model for an entity class and return its version."""
    with connect(settings) as conn:
        # the advisory lock serialises concurrent trainers of the same model so versions never collide
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{detector}/{entity_class}",))
        row = conn.execute(
            "SELECT coalesce(max(version), 0) + 1 FROM detector_models WHERE detector = %s AND entity_class = %s",
            (detector, entity_class),
        ).fetchone()
        version = int(row[0]) if row else 1
        conn.execute(
            "INSERT INTO detector_models (detector, entity_class, version, training, threshold, model)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (detector, entity_class, version, json.dumps(training), threshold, model),
        )
        conn.commit()
    return version


def latest_models(settings: Settings, detector: str) -> dict[str, StoredModel]:
    """The newest model of ``detector`` for each entity class."""
    with connect(settings) as conn:
        rows = conn.execute(
            "SELECT DISTINCT ON (entity_class) detector, entity_class, version, trained_at, training, threshold, model"
            " FROM detector_models WHERE detector = %s ORDER BY entity_class, version DESC",
            (detector,),
        ).fetchall()
    return {r[1]: StoredModel(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6])) for r in rows}


def latest_versions(settings: Settings, detector: str) -> dict[str, int]:
    """The newest version number of ``detector`` for each entity class (cheap: no model bytes)."""
    with connect(settings) as conn:
        rows = conn.execute(
            "SELECT entity_class, max(version) FROM detector_models WHERE detector = %s GROUP BY entity_class",
            (detector,),
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def list_models(settings: Settings) -> list[StoredModel]:
    """Every stored model version, newest first (model bytes omitted)."""
    with connect(settings) as conn:
        rows = conn.execute(
            "SELECT detector, entity_class, version, trained_at, training, threshold"
            " FROM detector_models ORDER BY trained_at DESC, detector, entity_class"
        ).fetchall()
    return [StoredModel(r[0], r[1], r[2], r[3], r[4], r[5], b"") for r in rows]
