"""Render the post-incident report of one stored incident: the function every caller uses.

``medic report``, ``GET /api/v1/incidents/{id}/report`` and the Celery task that renders a report when an
incident resolves (:mod:`services.reports.archive`) all call :func:`render_report` or :func:`build_incident_report`:
facts from PostgreSQL, series from the metric source, plots, then the format asked for. The same stored
incident version gives the same report (nothing in it depends on the wall clock), so a task may render it
again after a redelivery and get the same bytes.

Files written for ``--out DIR`` (``DIR/<incident id>/``): ``report.md`` with the plots as PNG files beside
it, ``report.html`` (self-contained), ``report.pdf``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.core.settings import Settings
from services.reports.build import Report, build_report, scope_of, window_of
from services.reports.errors import RenderError
from services.reports.facts import load_facts
from services.reports.plots import draw_plots
from services.reports.render import html_to_pdf, to_html, to_markdown
from services.reports.telemetry import KafkaMetricSource, MetricSource

log = logging.getLogger(__name__)

Format = Literal["md", "html", "pdf"]
FORMATS: tuple[str, ...] = ("md", "html", "pdf")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Rendered:
    """What :func:`render_report` wrote.

    Attributes:
        report: the built report (its document, timeline and what was missing).
        files: every file written, the main one first.
    """

    report: Report
    files: list[Path] = field(default_factory=list)

    @property
    def main(self) -> Path:
        """The report file itself (``report.md``, ``report.html`` or ``report.pdf``)."""
        return self.files[0]


def build_incident_report(
    settings: Settings, incident_id: str, *, telemetry: MetricSource | None = None, plots: bool = True
) -> Report:
    """Read the incident's facts and telemetry and build its report (nothing written).

    Args:
        settings: the database, the broker (the default telemetry source) and the knowledge folder.
        incident_id: a stored incident.
        telemetry: where the plotted series come from (default: ``telemetry.metrics.v1``).
        plots: False leaves the plots out (and does not read telemetry).

    Raises:
        IncidentNotFound: no such incident is stored.
        InfraNotReady: PostgreSQL is unreachable.
    """
    from services.core.errors import ConfigError
    from services.diagnostician.ranker import runbook_index

    facts = load_facts(settings, incident_id)
    try:
        runbooks = runbook_index(settings.kb_dir).runbooks
    except ConfigError as exc:  # a broken knowledge folder costs the prevention advice, not the report
        log.warning("no runbooks for the report of %s: %s", incident_id, exc)
        runbooks = ()
    found = None
    plotted = None
    if plots:
        source = telemetry if telemetry is not None else KafkaMetricSource(settings)
        lo, hi = window_of(facts)
        found = source.fetch(scope_of(facts), lo, hi)
        plotted = draw_plots(facts, found)
    return build_report(facts, telemetry=found, runbooks=runbooks, plots=plotted)


def render_report(
    settings: Settings,
    incident_id: str,
    fmt: Format,
    out_dir: Path,
    *,
    telemetry: MetricSource | None = None,
    chromium: str | None = None,
) -> Rendered:
    """Build the report of ``incident_id`` and write it in ``fmt`` under ``out_dir/<incident id>/``.

    Raises:
        IncidentNotFound: no such incident is stored.
        InfraNotReady: PostgreSQL is unreachable.
        RenderError: an unknown format, or the PDF could not be printed (no Chromium).
    """
    if fmt not in FORMATS:
        raise RenderError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    report = build_incident_report(settings, incident_id, telemetry=telemetry)
    assert report.document is not None
    folder = out_dir / _SAFE.sub("_", incident_id)
    folder.mkdir(parents=True, exist_ok=True)
    out = Rendered(report)
    if fmt == "md":
        main = folder / "report.md"
        main.write_text(to_markdown(report.document), encoding="utf-8")
        out.files.append(main)
        for figure in report.document.figures():
            path = folder / figure.name
            path.write_bytes(figure.png)
            out.files.append(path)
    elif fmt == "html":
        main = folder / "report.html"
        main.write_text(to_html(report.document), encoding="utf-8")
        out.files.append(main)
    else:
        main = folder / "report.pdf"
        main.write_bytes(html_to_pdf(to_html(report.document), chromium=chromium))
        out.files.append(main)
    return out
