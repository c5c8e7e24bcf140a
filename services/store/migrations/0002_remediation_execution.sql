-- Remediation execution state (services/remediation): what the policy decided, the plan frozen at
-- precheck time, the execution token that makes stale Celery messages no-ops, the lease the recovery
-- sweep watches, and an append-only audit trail of who decided what.

ALTER TABLE remediation_runs
    ADD COLUMN automatic      boolean NOT NULL DEFAULT true,
    ADD COLUMN targets        jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN scope          jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN reasons        jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN observed       jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN plan           jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN rollback_plan  jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN rollback_state text NOT NULL DEFAULT '' CHECK (rollback_state IN ('', 'pending', 'done')),
    ADD COLUMN token          text NOT NULL DEFAULT '',
    ADD COLUMN lease_until    timestamptz,
    ADD COLUMN updated_at     timestamptz NOT NULL DEFAULT now();

CREATE INDEX remediation_runs_status_idx ON remediation_runs (status, lease_until);
CREATE INDEX remediation_runs_started_idx ON remediation_runs (started_at DESC);

CREATE TABLE remediation_audit (
    id        bigserial PRIMARY KEY,
    run_id    text NOT NULL REFERENCES remediation_runs (run_id) ON DELETE CASCADE,
    ts        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    action    text NOT NULL,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX remediation_audit_run_idx ON remediation_audit (run_id, id);
