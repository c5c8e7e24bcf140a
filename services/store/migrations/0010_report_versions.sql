-- Issue 17 item 4: the report task renders a report when an incident resolves, once per incident version.
-- A report is keyed by its incident and the incident's stored `updated_at` it was built from (`version`):
-- a redelivered task finds its row and renders nothing new, an incident that resolves again after a
-- reopening gets a second report. It keeps the HTML beside the Markdown (what the link in Slack serves),
-- the one-paragraph summary posted to Slack, the root cause it was indexed under, the knowledge-base
-- document it became, and the Slack messages it posted (channel -> message ts), so a retry posts only
-- where it has not.
ALTER TABLE reports ADD COLUMN version timestamptz;
UPDATE reports SET version = created_at WHERE version IS NULL;
ALTER TABLE reports ALTER COLUMN version SET NOT NULL;
ALTER TABLE reports DROP CONSTRAINT reports_pkey;
ALTER TABLE reports ADD PRIMARY KEY (incident_id, version);
ALTER TABLE reports ADD COLUMN body_html text NOT NULL DEFAULT '';
ALTER TABLE reports ADD COLUMN summary text NOT NULL DEFAULT '';
ALTER TABLE reports ADD COLUMN root_cause text;
ALTER TABLE reports ADD COLUMN kb_doc_id text;
ALTER TABLE reports ADD COLUMN posted jsonb NOT NULL DEFAULT '{}'::jsonb;
