-- The seq of the call the same task made before this one, where that is not seq - 1: a
-- call of one of several tasks a workflow runs at once (asyncio.gather), which a replay
-- matches by it whatever order the tasks come back in (NULL: seq - 1, the call before).
ALTER TABLE journal ADD COLUMN follows BIGINT;
