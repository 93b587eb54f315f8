-- The journal entries a workflow has not finished with (an intent without its receipt, a
-- step waiting to retry), by workflow: the dashboard's look at one workflow reads these
-- and the journal's count and last seq (the primary key's entries), never the entries'
-- rows with their payloads. A plain step writes its receipt as its
-- first entry, which this index does not hold: only an intent or a retry writes here.
-- IF NOT EXISTS: on a large PostgreSQL database an operator may build it beforehand with
-- CREATE INDEX CONCURRENTLY, which does not block writes (docs/operations.md); one line, as
-- SQLite keeps an index's text as written and the schema tests compare it.
CREATE INDEX IF NOT EXISTS journal_open ON journal (workflow_id, seq) WHERE status IN ('started', 'retrying');
