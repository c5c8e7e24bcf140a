-- Diagnostician: the evidence tools look for anomalies near an incident in time (topology neighbours,
-- recent rollouts) without knowing their entity, which anomalies_entity_ts_idx cannot serve.
CREATE INDEX IF NOT EXISTS anomalies_ts_idx ON anomalies (ts DESC);
