-- The correlate role: silences managed through the API/CLI and polled by the correlate agent;
-- incidents listed by recency.

-- Expiring a silence that has not started yet ends it before it ever starts (starts_at = ends_at,
-- as Alertmanager does), which the strict check of 0001 refused.
ALTER TABLE silences DROP CONSTRAINT IF EXISTS silences_check;
ALTER TABLE silences ADD CONSTRAINT silences_ends_not_before_start CHECK (ends_at >= starts_at);
-- When a silence last changed (created or expired).
ALTER TABLE silences ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
-- The agent reads the silences that are not long expired.
CREATE INDEX silences_ends_at_idx ON silences (ends_at);

-- `medic incidents list` and GET /api/v1/incidents show the most recently changed first.
CREATE INDEX incidents_updated_at_idx ON incidents (updated_at DESC);
