"""``GET /incidents/{incident_id}/report?format=md|html|pdf``: an incident's post-incident report over HTTP.

:func:`create_router` returns a FastAPI router that the API app mounts under ``/api/v1`` (so the route is
``GET /api/v1/incidents/{id}/report``) behind the same authentication as every other route. Markdown comes
back as one self-contained text (plots inlined as ``data:`` URIs), HTML self-contained, PDF printed by
headless Chromium. An unknown incident is 404; a database that is down is 503; a PDF without Chromium is 501.
Rendering blocks (queries, plots, Chromium), so the handler is a plain function FastAPI runs in its thread pool.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Query, Response

from services.auth.http import Viewer
from services.core.errors import InfraError
from services.core.settings import Settings
from services.reports.errors import IncidentNotFound, RenderError
from services.reports.telemetry import MetricSource

MEDIA_TYPES = {"md": "text/markdown; charset=utf-8", "html": "text/html; charset=utf-8", "pdf": "application/pdf"}


def create_router(settings: Settings, *, telemetry: MetricSource | None = None) -> APIRouter:
    """The report route, reading the stores of ``settings`` (and ``telemetry``, default telemetry.metrics.v1)."""
    router = APIRouter(tags=["reports"])

    @router.get("/incidents/{incident_id}/report", response_class=Response)
    def incident_report(
        incident_id: str,
        auth: Viewer,
        format: Literal["md", "html", "pdf"] = Query("html", description="md, html or pdf"),
    ) -> Response:
        from services.reports.render import html_to_pdf, to_html, to_markdown
        from services.reports.service import build_incident_report

        try:
            report = build_incident_report(settings, incident_id, telemetry=telemetry)
            assert report.document is not None
            if format == "md":
                body: bytes = to_markdown(report.document, image_uri=True).encode()
            elif format == "html":
                body = to_html(report.document).encode()
            else:
                body = html_to_pdf(to_html(report.document))
        except IncidentNotFound as exc:
            raise HTTPException(404, str(exc)) from exc
        except RenderError as exc:
            raise HTTPException(501, str(exc)) from exc
        except InfraError as exc:
            raise HTTPException(503, "database unavailable") from exc
        name = f"{incident_id}.{format}".replace('"', "")
        disposition = "attachment" if format == "pdf" else "inline"
        return Response(
            body, media_type=MEDIA_TYPES[format], headers={"Content-Disposition": f'{disposition}; filename="{name}"'}
        )

    return router
