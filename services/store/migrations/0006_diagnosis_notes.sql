-- Trust model (issue 13): a diagnosis says why it withheld or limited an action (an XID quoted in an
-- application log, a webhook alert nothing ClusterMedic collected corroborates). The notes are shown
-- to humans, so they are stored with the diagnosis.

ALTER TABLE diagnoses ADD COLUMN notes text[] NOT NULL DEFAULT '{}';
