-- ClusterMedic schema, version 1. Applied by `medic db migrate`; never edit an applied migration,
-- add a new numbered file instead.

CREATE EXTENSION IF NOT EXISTS vector;

-- One row per incident; the correlate stage upserts on incident_id so a replay never duplicates one.
CREATE TABLE incidents (
    incident_id   text PRIMARY KEY,
    group_key     text NOT NULL DEFAULT '',
    title         text NOT NULL,
    status        text NOT NULL CHECK (status IN ('opened', 'updated', 'mitigated', 'resolved')),
    severity      text NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    opened_at     timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    mitigated_at  timestamptz,
    resolved_at   timestamptz
);
CREATE INDEX incidents_status_idx ON incidents (status, opened_at DESC);

-- Alerts stay linked to their incident, each with its own evidence; they are never merged.
CREATE TABLE alerts (
    fingerprint   text NOT NULL,
    incident_id   text NOT NULL REFERENCES incidents (incident_id) ON DELETE CASCADE,
    entity        text NOT NULL,
    signal        text NOT NULL,
    detector      text NOT NULL,
    severity      text NOT NULL,
    status        text NOT NULL CHECK (status IN ('firing', 'resolved')),
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    evidence      jsonb NOT NULL DEFAULT '{}'::jsonb,
    starts_at     timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    ends_at       timestamptz,
    PRIMARY KEY (incident_id, fingerprint)
);
CREATE INDEX alerts_fingerprint_idx ON alerts (fingerprint);

-- Anomalies worth keeping (the evidence behind alerts, training labels for detectors).
CREATE TABLE anomalies (
    id            bigserial PRIMARY KEY,
    fingerprint   text NOT NULL,
    entity        text NOT NULL,
    entity_kind   text NOT NULL,
    signal        text NOT NULL,
    detector      text NOT NULL,
    score         double precision NOT NULL,
    threshold     double precision NOT NULL,
    severity      text NOT NULL,
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    evidence      jsonb NOT NULL DEFAULT '{}'::jsonb,
    ts            timestamptz NOT NULL,
    UNIQUE (fingerprint, ts)
);
CREATE INDEX anomalies_entity_ts_idx ON anomalies (entity, ts DESC);

CREATE TABLE diagnoses (
    id                bigserial PRIMARY KEY,
    incident_id       text NOT NULL REFERENCES incidents (incident_id) ON DELETE CASCADE,
    diagnostician     text NOT NULL,
    hypotheses        jsonb NOT NULL,
    proposed_playbook text,
    proposed_params   jsonb NOT NULL DEFAULT '{}'::jsonb,
    level             smallint CHECK (level BETWEEN 1 AND 3),
    latency_ms        double precision NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX diagnoses_incident_idx ON diagnoses (incident_id, created_at DESC);

-- Remediation audit log: a run and each step get a unique id recorded before they act, so a
-- redelivered Celery task finds its row and does nothing twice.
CREATE TABLE remediation_runs (
    run_id        text PRIMARY KEY,
    incident_id   text NOT NULL,
    playbook      text NOT NULL,
    level         smallint NOT NULL CHECK (level BETWEEN 1 AND 3),
    params        jsonb NOT NULL DEFAULT '{}'::jsonb,
    status        text NOT NULL,
    decided_by    text NOT NULL,
    dry_run       boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz,
    detail        text NOT NULL DEFAULT ''
);
CREATE INDEX remediation_runs_incident_idx ON remediation_runs (incident_id);

CREATE TABLE remediation_steps (
    step_id       text PRIMARY KEY,
    run_id        text NOT NULL REFERENCES remediation_runs (run_id) ON DELETE CASCADE,
    position      integer NOT NULL,
    name          text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('precheck', 'action', 'verify', 'rollback')),
    status        text NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    started_at    timestamptz,
    finished_at   timestamptz,
    output        jsonb NOT NULL DEFAULT '{}'::jsonb,
    UNIQUE (run_id, position, kind)
);

CREATE TABLE approvals (
    run_id        text PRIMARY KEY REFERENCES remediation_runs (run_id) ON DELETE CASCADE,
    status        text NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired')),
    requested_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    decided_at    timestamptz,
    approver      text NOT NULL DEFAULT '',
    channel       text NOT NULL DEFAULT '',
    comment       text NOT NULL DEFAULT ''
);

CREATE TABLE silences (
    silence_id    text PRIMARY KEY,
    matchers      jsonb NOT NULL,
    starts_at     timestamptz NOT NULL,
    ends_at       timestamptz NOT NULL,
    created_by    text NOT NULL,
    comment       text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (ends_at > starts_at)
);

-- Knowledge base: runbooks, post-mortems and reports, chunked for hybrid retrieval.
CREATE TABLE kb_documents (
    doc_id        text PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('runbook', 'postmortem', 'report', 'incident')),
    title         text NOT NULL,
    path          text NOT NULL DEFAULT '',
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    content_hash  text NOT NULL,
    indexed_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE kb_chunks (
    chunk_id      bigserial PRIMARY KEY,
    doc_id        text NOT NULL REFERENCES kb_documents (doc_id) ON DELETE CASCADE,
    position      integer NOT NULL,
    content       text NOT NULL,
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    embedding     vector(384) NOT NULL,
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    UNIQUE (doc_id, position)
);
CREATE INDEX kb_chunks_embedding_idx ON kb_chunks USING hnsw (embedding vector_cosine_ops);
CREATE INDEX kb_chunks_tsv_idx ON kb_chunks USING gin (tsv);
CREATE INDEX kb_chunks_labels_idx ON kb_chunks USING gin (labels);

CREATE TABLE reports (
    incident_id   text PRIMARY KEY REFERENCES incidents (incident_id) ON DELETE CASCADE,
    title         text NOT NULL,
    body_md       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Trained detector models, versioned per detector and entity class; workers warm-start from the latest.
CREATE TABLE detector_models (
    id            bigserial PRIMARY KEY,
    detector      text NOT NULL,
    entity_class  text NOT NULL,
    version       integer NOT NULL,
    trained_at    timestamptz NOT NULL DEFAULT now(),
    training      jsonb NOT NULL DEFAULT '{}'::jsonb,
    threshold     double precision,
    model         bytea NOT NULL,
    UNIQUE (detector, entity_class, version)
);
