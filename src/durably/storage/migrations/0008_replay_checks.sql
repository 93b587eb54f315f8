-- A digest of each step's encoded arguments, checked when the step is replayed
-- (NULL: not a step, arguments that cannot be encoded, or journaled before this).
ALTER TABLE journal ADD COLUMN args_digest TEXT;

-- What a replay of the workflow found and went on past (a step called with other
-- arguments), one line each; NULL: nothing.
ALTER TABLE workflows ADD COLUMN warnings TEXT;
