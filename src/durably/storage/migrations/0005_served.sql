-- What each executor serves, so that operators (`durably workers`, `durably list`) and
-- other engines can tell whether anyone runs a workflow: JSON text,
-- {"workflows": [[name, version, source_hash], ...], "queues": [name, ...]}.
-- NULL for an executor registered by an older durably.

ALTER TABLE executors ADD COLUMN serves TEXT;
