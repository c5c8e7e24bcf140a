"""The knowledge base on pgvector: incremental indexing and hybrid retrieval.

Indexing (``medic kb index``) compares each document's content hash with ``kb_documents``: unchanged
documents are skipped without embedding anything, new and changed ones are re-chunked and their chunks
replaced in one transaction, and runbooks or post-mortems whose file disappeared are deleted (their
chunks go with them, ``ON DELETE CASCADE``). Incident documents are never deleted by a re-index.

Retrieval is one SQL statement: the vector branch (HNSW, cosine distance) and the full-text branch
(``ts_rank_cd`` over the stored ``tsvector``) each rank their top candidates, and the two rankings are
fused with reciprocal rank fusion, ``score = sum 1 / (k + rank)`` with ``k = 60`` (Cormack et al.,
2009). RRF needs no score calibration between a cosine distance and a text rank, which is why it is
used rather than a weighted sum. Labels filter both branches with jsonb containment (``@>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from services.core.errors import StoreError
from services.core.events import IncidentEvent
from services.core.settings import Settings
from services.diagnostician.documents import KbDocument, incident_document, load_documents, postmortem_document
from services.diagnostician.embedder import Embedder, make_embedder

RRF_K = 60
SOURCE_KINDS: tuple[str, ...] = ("runbook", "postmortem")
_WORD = re.compile(r"[A-Za-z0-9]+")
# Words that carry no meaning for retrieval even though Postgres' English dictionary keeps them.
_NOISE = frozenset({"or", "and", "not", "the", "a", "of", "to", "in", "on", "is", "for", "with"})


@dataclass(frozen=True)
class IndexReport:
    """What one indexing run did."""

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    chunks: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Counts and the ids that changed, for the CLI's JSON output."""
        return {
            "added": list(self.added),
            "updated": list(self.updated),
            "removed": list(self.removed),
            "unchanged": len(self.unchanged),
            "chunks_written": self.chunks,
        }


@dataclass(frozen=True)
class SearchHit:
    """One document found by hybrid retrieval, represented by its best chunk.

    Attributes:
        doc_id: the document (runbook id, post-mortem id, incident id).
        kind: runbook, postmortem, report or incident.
        title: document title.
        excerpt: the best chunk without its title and signal header, shortened.
        score: fused RRF score (higher is better; at most 2 / 61).
        position: chunk position within the document.
        metadata: the document's metadata (root_cause, playbooks...).
        vector_rank: the chunk's rank in the vector branch, or None if it was not a candidate there.
        text_rank: the chunk's rank in the full-text branch, or None.
    """

    doc_id: str
    kind: str
    title: str
    excerpt: str
    score: float
    position: int
    metadata: dict[str, Any]
    vector_rank: int | None = None
    text_rank: int | None = None

    @property
    def root_cause(self) -> str:
        """The document's root-cause category ('' when it has none)."""
        return str(self.metadata.get("root_cause", ""))


def rrf_scores(rankings: Iterable[Sequence[Any]], k: int = RRF_K) -> dict[Any, float]:
    """Reciprocal rank fusion of ranked lists (best first): ``sum over lists of 1 / (k + rank)``, rank from 1.

    The SQL in :func:`search` computes the same thing; this is the reference the unit tests check.
    """
    scores: dict[Any, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


def or_query(text: str, max_terms: int = 64) -> str:
    """Turn free text into a ``websearch_to_tsquery`` string that matches ANY of its words.

    Evidence-built queries hold dozens of words; requiring all of them (the default AND) would match
    nothing, while OR with ``ts_rank_cd`` still ranks passages matching more words higher.
    """
    words: list[str] = []
    seen: set[str] = set()
    for word in _WORD.findall(text):
        lowered = word.lower()
        if lowered in _NOISE or lowered in seen:
            continue
        seen.add(lowered)
        words.append(lowered)
        if len(words) >= max_terms:
            break
    return " or ".join(words)


def configure_session(conn: psycopg.Connection) -> None:
    """Per-connection settings for retrieval: a wider HNSW search and iterative scans under filters."""
    # iterative scans (pgvector >= 0.8) keep returning rows when a label filter rejects many neighbours
    try:
        with conn.transaction():
            conn.execute("SET hnsw.ef_search = 100")
            conn.execute("SET hnsw.iterative_scan = relaxed_order")
    except psycopg.Error:
        pass  # older pgvector: filtered searches may return fewer hits, never wrong ones


# --------------------------------------------------------------------------------------- indexing


def existing_hashes(conn: psycopg.Connection, kinds: Sequence[str] = SOURCE_KINDS) -> dict[str, str]:
    """``doc_id -> content_hash`` of the stored documents of these kinds."""
    rows = conn.execute("SELECT doc_id, content_hash FROM kb_documents WHERE kind = ANY(%s)", (list(kinds),)).fetchall()
    return {row[0]: row[1] for row in rows}


def index_documents(
    conn: psycopg.Connection,
    embedder: Embedder,
    documents: Sequence[KbDocument],
    *,
    remove_missing: bool = True,
    kinds: Sequence[str] = SOURCE_KINDS,
) -> IndexReport:
    """Bring the knowledge base in line with ``documents``, embedding only what changed.

    Args:
        conn: a connection (not in autocommit); committed on success, rolled back on failure.
        embedder: embeds the chunks of new and changed documents.
        documents: the full current set of documents of ``kinds`` (or extra ones with
            ``remove_missing=False``).
        remove_missing: delete stored documents of ``kinds`` absent from ``documents``.
        kinds: the document kinds ``documents`` is authoritative for.

    Raises:
        StoreError: the database rejected a write.
    """
    try:
        stored = existing_hashes(conn, kinds)
        added = [doc for doc in documents if doc.doc_id not in stored]
        updated = [doc for doc in documents if doc.doc_id in stored and stored[doc.doc_id] != doc.content_hash]
        unchanged = [doc.doc_id for doc in documents if stored.get(doc.doc_id) == doc.content_hash]
        wanted = {doc.doc_id for doc in documents}
        removed = sorted(doc_id for doc_id in stored if doc_id not in wanted) if remove_missing else []
        changed = added + updated
        texts = [chunk.content for doc in changed for chunk in doc.chunks]
        vectors = embedder.embed(texts) if texts else np.zeros((0, 384), dtype=np.float32)
        with conn.transaction():
            if removed:
                conn.execute("DELETE FROM kb_documents WHERE doc_id = ANY(%s)", (removed,))
            if changed:
                conn.execute("DELETE FROM kb_chunks WHERE doc_id = ANY(%s)", ([doc.doc_id for doc in changed],))
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO kb_documents (doc_id, kind, title, path, metadata, content_hash, indexed_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s, now())"
                        " ON CONFLICT (doc_id) DO UPDATE SET kind = EXCLUDED.kind, title = EXCLUDED.title,"
                        " path = EXCLUDED.path, metadata = EXCLUDED.metadata,"
                        " content_hash = EXCLUDED.content_hash, indexed_at = now()",
                        [
                            (doc.doc_id, doc.kind, doc.title, doc.path, Jsonb(doc.metadata), doc.content_hash)
                            for doc in changed
                        ],
                    )
                rows = (
                    (doc.doc_id, chunk.position, chunk.content, chunk.labels) for doc in changed for chunk in doc.chunks
                )
                copy_chunks(conn, rows, vectors)
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        raise StoreError(f"indexing the knowledge base failed: {exc}") from exc
    return IndexReport(
        added=tuple(doc.doc_id for doc in added),
        updated=tuple(doc.doc_id for doc in updated),
        unchanged=tuple(unchanged),
        removed=tuple(removed),
        chunks=len(texts),
    )


def copy_chunks(
    conn: psycopg.Connection,
    rows: Iterable[tuple[str, int, str, Mapping[str, Any]]],
    vectors: np.ndarray,
) -> int:
    """Write chunks with ``COPY ... FORMAT BINARY`` (doc_id, position, content, labels) + one vector each."""
    written = 0
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY kb_chunks (doc_id, position, content, labels, embedding) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy,
    ):
        copy.set_types(["text", "int4", "text", "jsonb", "vector"])
        for (doc_id, position, content, labels), vector in zip(rows, vectors, strict=True):
            copy.write_row((doc_id, position, content, Jsonb(dict(labels)), np.asarray(vector, dtype=np.float32)))
            written += 1
    return written


# -------------------------------------------------------------------------------------- retrieval

_SEARCH_SQL = """
WITH q AS (
    SELECT websearch_to_tsquery('english', %(text)s) AS any_word,
           websearch_to_tsquery('english', %(all_text)s) AS all_words
),
vec AS (
    SELECT chunk_id, row_number() OVER (ORDER BY dist) AS rank FROM (
        SELECT chunk_id, embedding <=> %(q)s AS dist FROM kb_chunks {where}
        ORDER BY embedding <=> %(q)s LIMIT %(n)s
    ) AS v
),
pool AS (
    (SELECT chunk_id, tsv FROM kb_chunks, q WHERE tsv @@ q.all_words {and_where} LIMIT %(pool)s)
    UNION
    (SELECT chunk_id, tsv FROM kb_chunks, q WHERE tsv @@ q.any_word {and_where} LIMIT %(pool)s)
),
fts AS (
    SELECT chunk_id, row_number() OVER (ORDER BY r DESC, chunk_id) AS rank FROM (
        SELECT chunk_id, ts_rank_cd(tsv, q.any_word) AS r FROM pool, q
        ORDER BY r DESC LIMIT %(n)s
    ) AS t
),
fused AS (
    SELECT chunk_id, sum(1.0 / (%(rrf_k)s + rank)) AS score,
           min(rank) FILTER (WHERE src = 'v') AS vrank, min(rank) FILTER (WHERE src = 't') AS trank
    FROM (SELECT chunk_id, rank, 'v' AS src FROM vec UNION ALL SELECT chunk_id, rank, 't' FROM fts) AS u
    GROUP BY chunk_id
),
best AS (
    SELECT DISTINCT ON (c.doc_id) c.doc_id, c.position, c.content, f.score, f.vrank, f.trank
    FROM fused f JOIN kb_chunks c USING (chunk_id)
    ORDER BY c.doc_id, f.score DESC, c.position
)
SELECT b.doc_id, d.kind, d.title, b.position, b.content, b.score::float8, d.metadata, b.vrank, b.trank
FROM best b JOIN kb_documents d USING (doc_id)
ORDER BY b.score DESC, b.doc_id
LIMIT %(k)s
"""
# ts_rank_cd must read every candidate's tsvector from the heap: ranking all 40,000 chunks that match
# "gpu or node or cache..." in a 100,000-chunk base takes ~700 ms. So the full-text branch ranks a
# bounded pool: chunks containing ALL the words (precise; usually few) plus up to FTS_POOL chunks
# containing ANY of them. Below FTS_POOL matches (any curated knowledge base) the ranking is exact.
FTS_POOL = 1000


def search(
    conn: psycopg.Connection,
    query_vector: np.ndarray,
    text: str,
    *,
    k: int = 8,
    labels: Mapping[str, Any] | None = None,
    kinds: Sequence[str] | None = None,
    candidates: int | None = None,
) -> list[SearchHit]:
    """Hybrid search: the best ``k`` documents by RRF of vector and full-text rankings, one row each.

    Args:
        conn: an open connection (pgvector type registered).
        query_vector: the embedded query (unit length, 384 dims).
        text: the query text for the full-text branch (any of its words may match).
        k: documents returned.
        labels: only chunks whose labels contain this mapping (jsonb ``@>``).
        kinds: only documents of these kinds (``runbook``, ``postmortem``, ``incident``, ``report``).
        candidates: chunks each branch contributes before fusion (default ``max(4k, 40)``).

    Raises:
        StoreError: the query failed.
    """
    conditions: list[str] = []
    params: dict[str, Any] = {
        "q": np.asarray(query_vector, dtype=np.float32),
        "text": or_query(text),
        "all_text": or_query(text).replace(" or ", " "),
        "pool": FTS_POOL,
        "n": candidates or max(4 * k, 40),
        "k": k,
        "rrf_k": RRF_K,
    }
    if labels:
        conditions.append("labels @> %(labels)s")
        params["labels"] = Jsonb(dict(labels))
    if kinds:
        conditions.append("labels->>'kind' = ANY(%(kinds)s)")
        params["kinds"] = list(kinds)
    where = ("WHERE " + " AND ".join(conditions)) if conditions else ""
    and_where = "".join(f" AND {c}" for c in conditions)
    sql = _SEARCH_SQL.format(where=where, and_where=and_where)
    try:
        rows = conn.execute(sql.encode(), params).fetchall()
    except psycopg.Error as exc:
        if not conn.autocommit:
            conn.rollback()
        raise StoreError(f"knowledge-base search failed: {exc}") from exc
    if not conn.autocommit:
        conn.rollback()  # read-only: end the implicit transaction so the connection stays idle
    return [
        SearchHit(
            doc_id=row[0],
            kind=row[1],
            title=row[2],
            position=row[3],
            excerpt=excerpt(row[4]),
            score=float(row[5]),
            metadata=row[6] or {},
            vector_rank=row[7],
            text_rank=row[8],
        )
        for row in rows
    ]


def excerpt(content: str, limit: int = 400) -> str:
    """A chunk without its title and signal header lines, cut at ``limit`` characters."""
    lines = content.split("\n")
    if len(lines) > 2 and (lines[1].startswith(("Signals:", "Post-mortem;", "Incident;"))):
        lines = lines[2:]
    body = "\n".join(lines).strip()
    return body if len(body) <= limit else body[: limit - 1].rstrip() + "…"


def kb_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Documents per kind and the chunk total."""
    counts = {row[0]: int(row[1]) for row in conn.execute("SELECT kind, count(*) FROM kb_documents GROUP BY kind")}
    row = conn.execute("SELECT count(*) FROM kb_chunks").fetchone()
    counts["chunks"] = int(row[0]) if row else 0
    if not conn.autocommit:
        conn.rollback()
    return counts


def index_knowledge(settings: Settings, embedder: Embedder | None = None, root: Path | None = None) -> IndexReport:
    """``medic kb index``: migrate, then index the runbooks and post-mortems under ``root`` incrementally.

    Args:
        settings: the database and, by default, the embedder and knowledge folder.
        embedder: default :func:`make_embedder` of the settings.
        root: knowledge folder; default ``settings.kb_dir`` or the repository's ``knowledge/``.
    """
    from services.store.db import connect, migrate

    embedder = embedder or make_embedder(settings)
    documents = load_documents(root or settings.kb_dir, salt=embedder_salt(embedder))
    migrate(settings)
    with connect(settings) as conn:
        return index_documents(conn, embedder, documents)


def index_incident(
    conn: psycopg.Connection, embedder: Embedder, incident: IncidentEvent, root_cause: str, summary: str = ""
) -> IndexReport:
    """Add (or refresh) a past incident with its confirmed root cause as a document of kind ``incident``."""
    document = incident_document(incident, root_cause, summary, salt=embedder_salt(embedder))
    return index_documents(conn, embedder, [document], remove_missing=False, kinds=("incident",))


def embedder_salt(embedder: Embedder) -> str:
    """What identifies the vectors an embedder produces (so switching models re-indexes)."""
    embedder = getattr(embedder, "inner", embedder)
    model = getattr(embedder, "model", None)
    return f"{embedder.name}:{model}" if isinstance(model, str) else embedder.name


def index_report(conn: psycopg.Connection, embedder: Embedder, document: KbDocument) -> IndexReport:
    """Add (or refresh) a generated post-incident report, a document of kind ``report``.

    Reports are never removed by ``medic kb index`` (which is authoritative for runbooks and post-mortems
    only): the knowledge folder does not hold them. An unchanged report (same content hash) embeds nothing.
    """
    return index_documents(conn, embedder, [document], remove_missing=False, kinds=("report",))


@dataclass(frozen=True)
class ImportedPostmortem:
    """What ``medic kb import-postmortem`` did.

    Attributes:
        doc_id: the post-mortem's id.
        path: where the file now is in the knowledge folder.
        copied: False when the same file was already there.
        index: what indexing did.
    """

    doc_id: str
    path: Path
    copied: bool
    index: IndexReport

    def as_dict(self) -> dict[str, Any]:
        """For the CLI's JSON output."""
        return {"doc_id": self.doc_id, "path": str(self.path), "copied": self.copied, **self.index.as_dict()}


def import_postmortem(
    settings: Settings,
    file: Path,
    *,
    embedder: Embedder | None = None,
    root: Path | None = None,
    replace: bool = False,
) -> ImportedPostmortem:
    """``medic kb import-postmortem``: validate a person-written post-mortem, file it and index it.

    The file is copied to ``<knowledge>/postmortems/<id>.md`` and indexed as kind ``postmortem``, so it is
    one more file of the knowledge folder: a later ``medic kb index`` keeps it (that command deletes the
    post-mortems whose file is gone), and it is reviewed and versioned like the others.

    Its ``root_cause`` must be one the diagnostician ranks: a runbook's, or ``gpu_xid_<code>`` (the XID
    catalog's); a post-mortem under any other cause would be indexed but never cited.

    Args:
        settings: the database, the embedder and, by default, the knowledge folder.
        file: the post-mortem (front matter as ``knowledge/postmortems/*.md``).
        embedder: default :func:`make_embedder` of the settings.
        root: knowledge folder; default ``settings.kb_dir`` or the repository's ``knowledge/``.
        replace: overwrite a different post-mortem already filed under the same id.

    Raises:
        ConfigError: the file is unreadable, its front matter invalid, its root cause unknown, or another
            post-mortem already has its id (without ``replace``).
        StoreError: the database rejected the write.
    """
    from services.core.errors import ConfigError
    from services.diagnostician.documents import default_knowledge_dir, parse_postmortem
    from services.diagnostician.runbooks import load_runbooks
    from services.store.db import connect, migrate

    try:
        source = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read post-mortem: {exc}") from exc
    meta, _ = parse_postmortem(source, file)
    folder = root or settings.kb_dir or default_knowledge_dir()
    causes = {rb.root_cause for rb in load_runbooks(folder / "runbooks")}
    if meta.root_cause not in causes and not re.fullmatch(r"gpu_xid_\d+", meta.root_cause):
        raise ConfigError(
            f"{file}: root_cause {meta.root_cause!r} is not a runbook's root cause nor gpu_xid_<code>;"
            f" known: {', '.join(sorted(causes))}"
        )
    target = folder / "postmortems" / f"{meta.id}.md"
    copied = True
    if target.exists():
        if target.read_text(encoding="utf-8") == source:
            copied = False
        elif not replace:
            raise ConfigError(f"{file}: a different post-mortem {meta.id!r} is already filed at {target}")
    others = [p for p in (folder / "postmortems").glob("*.md") if p != target] if target.parent.is_dir() else []
    for other in others:
        other_meta, _ = parse_postmortem(other.read_text(encoding="utf-8"), other)
        if other_meta.id == meta.id:
            raise ConfigError(f"{file}: post-mortem id {meta.id!r} is already used by {other}")
    if copied:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")
    embedder = embedder or make_embedder(settings)
    document = postmortem_document(target, salt=embedder_salt(embedder))
    migrate(settings)
    with connect(settings) as conn:
        report = index_documents(conn, embedder, [document], remove_missing=False, kinds=("postmortem",))
    return ImportedPostmortem(doc_id=meta.id, path=target, copied=copied, index=report)
