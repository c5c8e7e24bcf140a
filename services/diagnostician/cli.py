"""Knowledge-base and diagnosis commands, mounted by ``services/cli.py`` as ``medic kb ...`` and ``medic diagnose``.

``app`` holds ``index``, ``import-postmortem``, ``search`` and ``diagnose``; each command builds one Settings object and
prints JSON on stdout (progress and errors go to stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from services.core.errors import ClusterMedicError
from services.core.settings import Settings

app = typer.Typer(help="Knowledge base (runbooks, post-mortems) and diagnosis.", no_args_is_help=True)


def _print(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _fail(exc: ClusterMedicError) -> typer.Exit:
    sys.stderr.write(f"error: {exc}\n")
    return typer.Exit(1)


@app.command("index")
def index_cmd(
    path: Annotated[
        Path | None, typer.Option(help="Knowledge folder with runbooks/ and postmortems/ (default: knowledge/).")
    ] = None,
) -> None:
    """Index runbooks and post-mortems incrementally: unchanged files are skipped, removed ones deleted."""
    from services.diagnostician.kb import index_knowledge

    try:
        report = index_knowledge(Settings(), root=path)
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    _print(report.as_dict())


@app.command("import-postmortem")
def import_postmortem_cmd(
    file: Annotated[
        Path, typer.Argument(help="The post-mortem: Markdown with the front matter of knowledge/postmortems.")
    ],
    path: Annotated[
        Path | None, typer.Option(help="Knowledge folder to file it in (default: CLUSTERMEDIC_KB_DIR or knowledge/).")
    ] = None,
    replace: Annotated[bool, typer.Option(help="Overwrite a different post-mortem filed under the same id.")] = False,
) -> None:
    """Import a post-mortem people wrote: validate it, file it under postmortems/ and index it.

    Exit codes: 0 imported, 2 the file or its front matter is invalid (the message says which key), 1 the
    database or the embedder failed.
    """
    from services.core.errors import ConfigError
    from services.diagnostician.kb import import_postmortem

    try:
        imported = import_postmortem(Settings(), file, root=path, replace=replace)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(2) from exc
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    _print(imported.as_dict())


@app.command("search")
def search_cmd(
    text: Annotated[str, typer.Argument(help="What to look for, in words.")],
    k: Annotated[int, typer.Option(help="Documents to return.")] = 5,
    kind: Annotated[list[str] | None, typer.Option(help="Only these kinds (runbook, postmortem, incident).")] = None,
    label: Annotated[list[str] | None, typer.Option(help="Label filter KEY=VALUE (repeatable).")] = None,
) -> None:
    """Hybrid (vector + full-text, RRF) search of the knowledge base."""
    from services.diagnostician.embedder import make_embedder
    from services.diagnostician.kb import configure_session, search
    from services.store.db import connect

    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--label {item!r} must be KEY=VALUE")
        labels[key] = value
    settings = Settings()
    try:
        vector = make_embedder(settings).embed_one(text)
        with connect(settings) as conn:
            configure_session(conn)
            hits = search(conn, vector, text, k=k, labels=labels or None, kinds=kind or None)
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    _print(
        [
            {
                "doc_id": h.doc_id,
                "kind": h.kind,
                "title": h.title,
                "score": round(h.score, 5),
                "root_cause": h.root_cause,
                "excerpt": h.excerpt,
            }
            for h in hits
        ]
    )


@app.command("diagnose")
def diagnose_cmd(
    incident_id: Annotated[str, typer.Argument(help="Incident id as stored in the incidents table.")],
    store: Annotated[bool, typer.Option(help="Store the diagnosis in the diagnoses table.")] = True,
    publish: Annotated[bool, typer.Option(help="Publish the diagnosis on diagnoses.v1.")] = False,
) -> None:
    """Diagnose a stored incident and print the Diagnosis as JSON."""
    from services.core.bus import KafkaPublisher
    from services.diagnostician.diagnostician import diagnose_incident, load_incident
    from services.store.db import connect

    settings = Settings()
    try:
        with connect(settings) as conn:
            incident = load_incident(conn, incident_id)
        if incident is None:
            sys.stderr.write(f"error: no incident {incident_id!r}\n")
            raise typer.Exit(1)
        if publish:
            with KafkaPublisher(settings) as publisher:
                diagnosis = diagnose_incident(incident, settings, store=store, publisher=publisher)
        else:
            diagnosis = diagnose_incident(incident, settings, store=store)
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    _print(diagnosis.model_dump(mode="json"))


@app.command("eval")
def eval_cmd(
    seeds: Annotated[str, typer.Option(help="Seed range A-B (inclusive) or one seed.")] = "1-14",
    cases: Annotated[int | None, typer.Option(help="Stop after this many faults.")] = None,
    fault_type: Annotated[list[str] | None, typer.Option(help="Only these fault types (repeatable).")] = None,
    retrieval: Annotated[bool, typer.Option(help="Use the knowledge base (needs `medic kb index`).")] = False,
    nezha: Annotated[
        Path | None,
        typer.Option(help="Instead: replay a Nezha-layout RCA folder (e.g. ../shared/data/rca/nezha) and score it."),
    ] = None,
) -> None:
    """Top-1/top-3 root-cause accuracy and latency of the offline ranker on seeded simulator faults.

    With ``--nezha DIR`` the faults are instead those of a Nezha RCA data set, replayed as metric streams
    (evals/nezha.py); the other options do not apply.
    """
    if nezha is not None:
        _eval_nezha(nezha)
        return
    from evals.diagnose import evaluate, summarise
    from services.diagnostician.diagnostician import RankerDiagnostician
    from services.diagnostician.embedder import make_embedder
    from services.diagnostician.ranker import runbook_index

    first, _, last = seeds.partition("-")
    try:
        seed_range = range(int(first), int(last or first) + 1)
    except ValueError as exc:
        raise typer.BadParameter(f"--seeds {seeds!r} must be A-B or A") from exc
    settings = Settings()
    index = runbook_index(settings.kb_dir)
    doctor = RankerDiagnostician(
        settings, embedder=make_embedder(settings) if retrieval else None, index=index, use_database=retrieval
    )
    try:
        results = evaluate(settings, doctor, index, seed_range, fault_types=fault_type, max_cases=cases)
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    finally:
        doctor.close()
    _print({"seeds": f"{seed_range.start}-{seed_range.stop - 1}", **summarise(results)})


def _eval_nezha(root: Path) -> None:
    """``medic eval diagnose --nezha DIR``: the table on stderr, the JSON summary on stdout."""
    from evals.nezha import evaluate_nezha, format_table, summarise
    from services.diagnostician.documents import default_knowledge_dir

    settings = Settings()
    try:
        report = evaluate_nezha(root, settings.kb_dir or default_knowledge_dir())
    except ClusterMedicError as exc:
        raise _fail(exc) from exc
    summary = summarise(report)
    sys.stderr.write(format_table(summary) + "\n")
    _print(summary)
