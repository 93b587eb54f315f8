-- Queues, issue 14: the partition a queued workflow's concurrency is counted in
-- (`Queue(..., partition=True)`, `enqueue(..., partition_key=)`), and the debounce key of
-- a debounced enqueue (`enqueue(..., debounce=, delay=)`: a later one with the same key
-- supersedes it while it has not started). A delayed enqueue needs no column: a pending
-- workflow's wake_at is the time before which it is not claimed.

ALTER TABLE workflows ADD COLUMN partition_key TEXT;
ALTER TABLE workflows ADD COLUMN debounce_key TEXT;

CREATE INDEX workflows_by_partition ON workflows (queue, partition_key, status);
CREATE INDEX workflows_debounced ON workflows (queue, debounce_key)
    WHERE debounce_key IS NOT NULL;
