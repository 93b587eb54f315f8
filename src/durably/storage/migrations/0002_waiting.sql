-- Waiting without a process: signals, published events, cancellation requests.

ALTER TABLE workflows ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN signal_count BIGINT NOT NULL DEFAULT 0;

CREATE INDEX workflows_by_parent ON workflows (parent_id);
CREATE INDEX workflows_by_wake ON workflows (status, wake_at);

-- A signal is kept until a wait consumes it; num orders the signals of one workflow.
CREATE TABLE signals (
    workflow_id     TEXT NOT NULL,
    num             BIGINT NOT NULL,
    name            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    sent_at         DOUBLE PRECISION NOT NULL,
    consumed_seq    BIGINT,
    PRIMARY KEY (workflow_id, num)
);

CREATE UNIQUE INDEX signals_by_key ON signals (workflow_id, idempotency_key);
CREATE INDEX signals_waiting ON signals (workflow_id, name, consumed_seq);

-- The latest value a workflow published under each key (set_event).
CREATE TABLE events (
    workflow_id TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (workflow_id, key)
);
