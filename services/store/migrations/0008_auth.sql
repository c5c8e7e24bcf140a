-- Authentication and authorisation of the HTTP API (issue 18, item 1; services/auth, docs/api.md).

-- API tokens: only a SHA-256 hash of each is kept. A token reads `cmt_<id>_<secret>`: the id is its
-- public part (shown by `medic token list`, used to find the row), the secret 32 random bytes. A name
-- is the identity every write records (a run's approver, a silence's author); one active token per name.
CREATE TABLE api_tokens (
    id            text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{12}$'),
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    token_hash    text NOT NULL CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_by    text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    revoked_by    text NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX api_tokens_active_name_idx ON api_tokens (name) WHERE revoked_at IS NULL;

-- Every write through the API (and `medic token`): who, what, when, from where, and how it ended.
-- remediation_audit stays each run's own timeline (the system's steps too); an approval is in both,
-- with the same actor name and the run id as target here.
CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    ts        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    role      text NOT NULL DEFAULT '',
    via       text NOT NULL,
    action    text NOT NULL,
    target    text NOT NULL DEFAULT '',
    method    text NOT NULL DEFAULT '',
    path      text NOT NULL DEFAULT '',
    client    text NOT NULL DEFAULT '',
    status    integer,
    outcome   text NOT NULL CHECK (outcome IN ('ok', 'denied', 'refused', 'error')),
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_ts_idx ON audit_log (ts DESC, id DESC);
CREATE INDEX audit_log_actor_idx ON audit_log (actor, id DESC);

-- Signed requests seen recently (Slack's buttons): a signature is good for five minutes, so a
-- captured request could be sent again within them; the second sighting is refused.
CREATE TABLE seen_requests (
    source      text NOT NULL,
    key         text NOT NULL,
    request_ts  timestamptz NOT NULL,
    PRIMARY KEY (source, key)
);
CREATE INDEX seen_requests_ts_idx ON seen_requests (request_ts);
