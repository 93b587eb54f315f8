"""The durably workloads of ``python -m benchmarks`` and their same-run baselines.

Each function measures one thing once and returns one number; the caller runs
it in interleaved rounds and keeps min/median/max. Nothing here asserts speed.
Databases are long-lived (warm) files or PostgreSQL databases made once per
run: each round adds to the same database, as a long-running engine would.
"""

from __future__ import annotations

import sqlite3

import durably

# The workloads and baselines ``durably bench`` times too live in the package:
# ``python -m benchmarks`` times the same ones.
from durably.bench.processes import processes_throughput
from durably.bench.recovery import fresh_seconds, recovery_seconds
from durably.bench.workloads import (  # re-exported for __main__ and statements
    PAYLOAD,
    PAYLOAD_JSON,
    RawPostgres,
    RawSqlite,
    replay_us,
    signal_us,
    step_us,
    steps_workflow,
    sync_step_us,
    throughput,
)

__all__ = [
    "PAYLOAD",
    "PAYLOAD_JSON",
    "RawPostgres",
    "RawSqlite",
    "fresh_seconds",
    "journal_bytes_per_step",
    "processes_throughput",
    "recovery_seconds",
    "replay_us",
    "signal_us",
    "step_us",
    "sync_step_us",
    "throughput",
]


async def journal_bytes_per_step(engine: durably.Engine, url: str, steps: int) -> float:
    """Bytes the journal table and its index grow by per step (SQLite dbstat / PG relation size)."""
    before = _journal_bytes(url)
    await (await engine.start(steps_workflow, steps)).result()
    return (_journal_bytes(url) - before) / steps


def _journal_bytes(url: str) -> int:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0])
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            row = conn.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = 'journal')"
            ).fetchone()
            return int(row[0] or 0)
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url.split("?")[0], autocommit=True) as pg:  # durably's options out
        row = pg.execute("SELECT pg_total_relation_size('durably.journal')").fetchone()
        return int(row[0]) if row else 0
