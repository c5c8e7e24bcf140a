"""``medic report INCIDENT_ID [--format md|html|pdf] [--out DIR]``: write an incident's post-incident report.

Mounted by ``services/cli.py`` as ``app.command("report")(reports_cli.report_cmd)``. It prints the path of
the report file on stdout (the plots' PNG files sit beside a Markdown report) and, on stderr, what the
report could not say. Exit codes: 0 written, 2 no such incident, 1 anything else that stopped it (the
database unreachable, no Chromium for a PDF).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from services.core.errors import ClusterMedicError
from services.core.settings import Settings
from services.reports.errors import IncidentNotFound

EXIT_NOT_FOUND = 2


def report_cmd(
    incident_id: Annotated[str, typer.Argument(help="The incident's id (`medic incidents list`).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="md (plots as PNG files beside it), html or pdf.")] = "md",
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write DIR/<incident id>/report.* into.")] = Path(
        "reports"
    ),
    no_telemetry: Annotated[
        bool, typer.Option("--no-telemetry", help="Do not read telemetry.metrics.v1: the series plots say so.")
    ] = False,
) -> None:
    """Write the post-incident report of a stored incident, built from stored facts only."""
    from services.reports.service import FORMATS, render_report
    from services.reports.telemetry import NoMetricSource

    if fmt not in FORMATS:
        sys.stderr.write(f"error: unknown format {fmt!r}; use one of {', '.join(FORMATS)}\n")
        raise typer.Exit(EXIT_NOT_FOUND)
    settings = Settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    source = NoMetricSource("not read (--no-telemetry)") if no_telemetry else None
    try:
        done = render_report(settings, incident_id, fmt, out, telemetry=source)  # type: ignore[arg-type]
    except IncidentNotFound as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(EXIT_NOT_FOUND) from exc
    except ClusterMedicError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(1) from exc
    for line in done.report.missing:
        sys.stderr.write(f"missing: {line}\n")
    sys.stdout.write(f"{done.main}\n")


app = typer.Typer(help="Post-incident reports.", add_completion=False, no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Post-incident reports (a group, so that ``report`` stays a subcommand of its own)."""


app.command("report")(report_cmd)

if __name__ == "__main__":  # `python -m services.reports.cli report ...` until `medic report` is mounted
    app()
