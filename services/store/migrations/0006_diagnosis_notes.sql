-- Trust model (issue 13). A diagnosis says why it withheld or limited an action (an XID quoted in an
-- application log, a webhook alert nothing ClusterMedic collected corroborates); the notes are shown
-- to humans, so they are stored with the diagnosis. An alert keeps its provenance, so an incident
-- re-read from the database (`medic diagnose`) is believed exactly as it was on incidents.v1; a row
-- written before this migration gets '{}', which is trusted for nothing.

ALTER TABLE diagnoses ADD COLUMN notes text[] NOT NULL DEFAULT '{}';
ALTER TABLE alerts ADD COLUMN provenance jsonb NOT NULL DEFAULT '{}'::jsonb;
