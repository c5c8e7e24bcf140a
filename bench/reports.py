"""Post-incident report benchmark: the time to render one report with its plots, and its size.

    python bench/reports.py [--runs N] [--telemetry kafka|memory] [--pdf]

Records the closed-loop XID 79 incident of scenario xid79 (seed 1) into a database of its own (evals/record.py),
its telemetry published to a fresh telemetry.metrics.v1 (``kafka``, the default, as a live stack has it) or
kept in memory, then renders its report ``--runs`` times: facts from PostgreSQL, the telemetry window, the
three plots, Markdown and HTML. Prints one JSON object: the first render (a fresh process: imports, the runbook
index) and the median of the others, stage by stage, and the sizes. The target is a render under 2 s on 2 cores.
Needs the local infrastructure (`make up`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from services.core.events import MetricBatch
from services.core.settings import Settings


def _record(settings: Settings, telemetry: str) -> tuple[str, Any]:
    from evals.record import record_episode
    from services.diagnostician.ranker import runbook_index
    from services.reports.telemetry import KafkaMetricSource, MemoryMetricSource
    from services.simulator.scenario import load_scenario

    batches: list[MetricBatch] = []
    producer = None
    if telemetry == "kafka":
        from kafka import KafkaProducer

        from services.core.bus import ensure_topics

        ensure_topics(settings, [MetricBatch.topic])
        producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=20)
        topic = settings.topic(MetricBatch.topic)

        def keep(batch: MetricBatch) -> None:
            stamp = int(batch.samples[0].ts * 1000) if batch.samples else None
            producer.send(topic, key=batch.entity.encode(), value=batch.to_bytes(), timestamp_ms=stamp)

    else:
        keep = batches.append
    epoch = float(int(time.time() // 60) * 60 - 7200)  # within the topic's retention
    episode = record_episode(settings, load_scenario("xid79"), 1, index=runbook_index(None), epoch=epoch, metrics=keep)
    if producer is not None:
        producer.flush(timeout=60)
        producer.close()
    incident = next(e.incident_id for e in episode.incidents if any(a.signal == "gpu_xid" for a in e.alerts))
    source = KafkaMetricSource(settings) if telemetry == "kafka" else MemoryMetricSource(batches)
    return incident, source


def _render_once(settings: Settings, incident_id: str, source: Any) -> dict[str, Any]:
    t = time.perf_counter()
    from services.diagnostician.ranker import runbook_index
    from services.reports.build import build_report, scope_of, window_of
    from services.reports.facts import load_facts
    from services.reports.plots import draw_plots
    from services.reports.render import to_html, to_markdown

    stages: dict[str, float] = {}
    facts = load_facts(settings, incident_id)
    runbooks = runbook_index(settings.kb_dir).runbooks
    stages["facts_s"] = time.perf_counter() - t
    t1 = time.perf_counter()
    lo, hi = window_of(facts)
    found = source.fetch(scope_of(facts), lo, hi)
    stages["telemetry_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    plots = draw_plots(facts, found)
    stages["plots_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    report = build_report(facts, telemetry=found, runbooks=runbooks, plots=plots)
    assert report.document is not None
    md = to_markdown(report.document)
    page = to_html(report.document)
    stages["render_s"] = time.perf_counter() - t1
    stages["total_s"] = time.perf_counter() - t
    figures = report.document.figures()
    return {
        **{k: round(v, 3) for k, v in stages.items()},
        "markdown_bytes": len(md.encode()),
        "plots_png_bytes": sum(len(f.png) for f in figures),
        "html_bytes": len(page.encode()),
        "plots": len(figures),
        "timeline_entries": len(report.timeline),
        "telemetry_batches": len(found.batches),
        "telemetry_records_scanned": found.scanned,
        "missing": len(report.missing),
        "_html": page,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="renders (the first is reported apart)")
    parser.add_argument("--telemetry", choices=("kafka", "memory"), default="kafka")
    parser.add_argument("--pdf", action="store_true", help="also time one PDF print with headless Chromium")
    args = parser.parse_args(argv)

    from evals.loop import loop_database

    base = Settings(topic_prefix=f"bench.{uuid.uuid4().hex[:8]}.")
    with loop_database(base) as settings:
        t = time.perf_counter()
        incident_id, source = _record(settings, args.telemetry)
        recorded_s = time.perf_counter() - t
        runs = [_render_once(settings, incident_id, source) for _ in range(max(1, args.runs))]
        html = runs[-1].pop("_html")
        for r in runs:
            r.pop("_html", None)
        warm = runs[1:] or runs
        out: dict[str, Any] = {
            "scenario": "xid79",
            "incident": incident_id,
            "telemetry": args.telemetry,
            "recording_s": round(recorded_s, 2),
            "first_render": runs[0],
            "render_median": {k: round(statistics.median(r[k] for r in warm), 3) for k in warm[0]},
            "runs": len(runs),
            "target_s": 2.0,
        }
        out["under_target"] = out["render_median"]["total_s"] < 2.0
        if args.pdf:
            from services.reports.render import html_to_pdf

            t = time.perf_counter()
            pdf = html_to_pdf(html)
            out["pdf"] = {"print_s": round(time.perf_counter() - t, 2), "bytes": len(pdf)}
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
