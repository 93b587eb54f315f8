-- The human review queue: steps whose outcome nothing could decide.

CREATE TABLE reviews (
    workflow_id     TEXT NOT NULL,
    seq             BIGINT NOT NULL,
    attempt         BIGINT NOT NULL,
    step            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    intent          TEXT,
    reason          TEXT NOT NULL,
    opened_at       DOUBLE PRECISION NOT NULL,
    decision        TEXT,
    outcome         TEXT,
    decided_by      TEXT,
    decided_at      DOUBLE PRECISION,
    PRIMARY KEY (workflow_id, seq, attempt)
);

CREATE INDEX reviews_open ON reviews (decision, opened_at);
