"""Post-incident reports built from stored facts only (docs/reports.md).

:func:`services.reports.service.render_report` is the one entry point: the CLI (``medic report``), the
API (``GET /api/v1/incidents/{id}/report``) and the Celery task that renders a report when an incident
resolves (:mod:`services.reports.tasks`, through :mod:`services.reports.archive`) all call it.
"""
