-- Guardrails enforced at execution (issue 13): the live kill switch lives in Postgres, so every worker
-- reads it inside the same transaction that moves a run to `running`, and again before each action.
-- (The YAML `policy.*.kill_switch` still works, but a worker reads its YAML only when it starts.)

CREATE TABLE remediation_controls (
    name        text PRIMARY KEY CHECK (name IN ('kill_switch')),
    enabled     boolean NOT NULL,
    set_by      text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- A failed run whose rollback is still pending is still touching its targets (blast radius).
CREATE INDEX remediation_runs_rollback_idx ON remediation_runs (rollback_state) WHERE rollback_state = 'pending';
