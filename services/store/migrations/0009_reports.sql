-- Issue 17 (post-incident reports): a report's timeline is on the incident's own clock, the event time
-- its incident, alerts, anomalies, runs and steps are stamped with. A diagnosis kept only `created_at`,
-- the database's wall time (under the simulator, or for a replay, far from the incident), so it now
-- also keeps the Diagnosis event's own time. A row written before this migration has NULL: a report
-- places it at `created_at` and says so.
ALTER TABLE diagnoses ADD COLUMN diagnosed_at timestamptz;
