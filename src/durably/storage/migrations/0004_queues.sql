-- Queues: which queue a workflow waits on, its priority there, a deduplication id,
-- and when it was first claimed (rate limits count these starts).

ALTER TABLE workflows ADD COLUMN queue TEXT;
ALTER TABLE workflows ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN deduplication_id TEXT;
ALTER TABLE workflows ADD COLUMN started_at DOUBLE PRECISION;

CREATE INDEX workflows_by_queue ON workflows (queue, status, priority, created_at);
CREATE INDEX workflows_queue_starts ON workflows (queue, started_at);

-- One unfinished workflow per (queue, deduplication id); a finished one frees the id.
CREATE UNIQUE INDEX workflows_deduplicated ON workflows (queue, deduplication_id)
    WHERE deduplication_id IS NOT NULL
      AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged');

-- One row per queue: claimers of a queue lock it, so they count its running
-- workflows and recent starts one at a time.
CREATE TABLE queues (
    name       TEXT PRIMARY KEY,
    claimed_at DOUBLE PRECISION
);
