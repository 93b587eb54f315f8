-- The first schema: workflows, their journal, claims (changes of owner) and executors.
-- Written once for SQLite and PostgreSQL: only types both accept (TEXT, BIGINT, DOUBLE PRECISION).

CREATE TABLE workflows (
    workflow_id      TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    version          TEXT,
    source_hash      TEXT,
    status           TEXT NOT NULL,
    input            TEXT NOT NULL,
    output           TEXT,
    error            TEXT,
    owner            TEXT,
    epoch            BIGINT NOT NULL DEFAULT 0,
    lease_expires_at DOUBLE PRECISION,
    crash_count      BIGINT NOT NULL DEFAULT 0,
    wake_at          DOUBLE PRECISION,
    parent_id        TEXT,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL
);

CREATE INDEX workflows_by_status ON workflows (status, created_at);
CREATE INDEX workflows_by_owner ON workflows (owner);

CREATE TABLE journal (
    workflow_id TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempt     BIGINT NOT NULL DEFAULT 1,
    payload     TEXT,
    started_at  DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    wake_at     DOUBLE PRECISION,
    PRIMARY KEY (workflow_id, seq)
);

CREATE TABLE claims (
    workflow_id    TEXT NOT NULL,
    epoch          BIGINT NOT NULL,
    owner          TEXT NOT NULL,
    claimed_at     DOUBLE PRECISION NOT NULL,
    previous_owner TEXT,
    reason         TEXT NOT NULL,
    PRIMARY KEY (workflow_id, epoch)
);

CREATE TABLE executors (
    executor_id  TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    pid_start    TEXT NOT NULL,
    started_at   DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);
