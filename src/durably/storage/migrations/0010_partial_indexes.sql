-- Indexes over a column that most workflows leave NULL hold only the rows that set it.
-- Every claim, park, wake-up and finish of a workflow changes its status, owner or
-- wake_at, so on PostgreSQL it is never a HOT update and writes an entry in every index
-- whose predicate the new row meets (SQLite: every index over a changed column). A
-- top-level workflow on no queue now writes the primary key, workflows_by_status and,
-- while it is owned, workflows_by_owner: three of eleven. Every query that reads these
-- indexes compares the column (queue = :queue, owner = :owner, parent_id = :parent_id,
-- wake_at <= :now or IS NOT NULL), which implies the predicate on both dialects.

DROP INDEX workflows_by_owner;
CREATE INDEX workflows_by_owner ON workflows (owner) WHERE owner IS NOT NULL;

DROP INDEX workflows_by_parent;
CREATE INDEX workflows_by_parent ON workflows (parent_id) WHERE parent_id IS NOT NULL;

DROP INDEX workflows_by_wake;
CREATE INDEX workflows_by_wake ON workflows (status, wake_at) WHERE wake_at IS NOT NULL;

DROP INDEX workflows_by_queue;
CREATE INDEX workflows_by_queue ON workflows (queue, status, priority, created_at)
    WHERE queue IS NOT NULL;

DROP INDEX workflows_queue_starts;
CREATE INDEX workflows_queue_starts ON workflows (queue, started_at) WHERE queue IS NOT NULL;

DROP INDEX workflows_by_partition;
CREATE INDEX workflows_by_partition ON workflows (queue, partition_key, status)
    WHERE queue IS NOT NULL;
