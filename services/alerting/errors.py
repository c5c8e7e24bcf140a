"""Errors of the Alertmanager model and the correlation engine that runs on it.

Both derive from the project root error so a consumer loop that catches ``ClusterMedicError`` handles
them; they belong under ``ClusterMedicError`` in the tree drawn in ``services/core/errors.py``::

    ClusterMedicError
    ├── ConfigError            (routing.yaml problems are raised as this one, never a new class)
    ├── SilenceError           a silence is invalid (no matcher, ends before it starts...)
    └── IncidentNotFound       an external call names an incident the engine does not hold
"""

from __future__ import annotations

from services.core.errors import ClusterMedicError


class SilenceError(ClusterMedicError):
    """A silence cannot be added or changed as asked."""


class IncidentNotFound(ClusterMedicError):
    """No incident with this id is held by the engine (never opened, or already forgotten)."""
