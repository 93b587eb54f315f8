-- A page of workflows, newest or oldest first (the dashboard, `durably workflows`,
-- list_workflows) reads this index from its end, LIMIT rows and no more, where it sorted
-- every workflow of the database before; the creation time never changes, so SQLite
-- writes it once per workflow (PostgreSQL: at every update that is not HOT).
-- IF NOT EXISTS: on a large PostgreSQL database an operator may build it beforehand with
-- CREATE INDEX CONCURRENTLY, which does not block writes (docs/operations.md).
CREATE INDEX IF NOT EXISTS workflows_by_created ON workflows (created_at);
