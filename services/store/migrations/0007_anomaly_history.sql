-- Issue 14: the correlate role writes every anomaly it consumes into `anomalies`
-- (services/store/anomalies.py), for the diagnostician's evidence tools (history of an alert's
-- fingerprint, anomalies on a neighbour node, recent rollouts). A row keeps the anomaly's status, so
-- a resolved occurrence is not counted as a firing one, and its provenance, so a reader knows where
-- it came from; a row written before this migration gets 'firing' and '{}' (trusted for nothing).

ALTER TABLE anomalies ADD COLUMN status text NOT NULL DEFAULT 'firing';
ALTER TABLE anomalies ADD COLUMN provenance jsonb NOT NULL DEFAULT '{}'::jsonb;
