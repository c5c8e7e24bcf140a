"""Errors of the post-incident reports, all under :class:`~services.core.errors.ClusterMedicError`::

    ClusterMedicError
    └── ReportError            a report cannot be made
        ├── IncidentNotFound   no stored incident has that id (the CLI exits 2, the API answers 404)
        ├── RenderError        the facts are there but a format cannot be produced (no Chromium for PDF)
        └── NotCaughtUp        the stored incident is older than the event that asked for its report
                               (the report task retries until the correlate role's upsert lands)

A missing diagnosis, run or telemetry is no error: the report says what is missing.
"""

from __future__ import annotations

from services.core.errors import ClusterMedicError


class ReportError(ClusterMedicError):
    """Root of the report errors."""


class IncidentNotFound(ReportError):
    """No incident with this id is stored."""

    def __init__(self, incident_id: str) -> None:
        super().__init__(f"no incident {incident_id!r} is stored (see `medic incidents list`)")
        self.incident_id = incident_id


class RenderError(ReportError):
    """A format could not be produced (the message says what to install or fix)."""


class NotCaughtUp(ReportError):
    """The stored incident is older than the resolved event that asked for its report.

    The correlate role publishes the event and upserts PostgreSQL; nothing orders the two, so the report
    task may run before the row says ``resolved``. It retries (with backoff) rather than report a state
    the event already left.
    """
