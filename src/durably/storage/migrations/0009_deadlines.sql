-- Deadlines: the time past which a workflow is cancelled wherever it is
-- (`start(..., timeout=)` or `@durably.workflow(timeout=)`, counted from the start or the
-- enqueue; a child's is no later than its parent's). NULL: no deadline.

ALTER TABLE workflows ADD COLUMN deadline_at DOUBLE PRECISION;

-- The deadlines still to enforce: unfinished workflows not yet asked to stop. Each pass
-- of an engine looks here for the ones due (queries.sql: due_deadlines, next_wake), with
-- the same predicate, so that the index serves it and finished workflows never cost a look.
CREATE INDEX workflows_deadlines ON workflows (deadline_at)
    WHERE deadline_at IS NOT NULL AND cancel_requested = 0
      AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged');
