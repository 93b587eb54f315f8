-- Where a fork came from: the workflow it copied and the last seq of the prefix it copied
-- (`fork(workflow_id, from_seq)`). NULL for a workflow that is not a fork.

ALTER TABLE workflows ADD COLUMN forked_from TEXT;
ALTER TABLE workflows ADD COLUMN forked_from_seq BIGINT;

-- How many crashes in a row this workflow may survive (`start(..., max_recoveries=)` or
-- `@durably.workflow(max_recoveries=)`); NULL: the engine's own limit.
ALTER TABLE workflows ADD COLUMN max_recoveries BIGINT;
