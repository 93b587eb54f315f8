"""The durably workloads of ``python -m benchmarks`` and their same-run baselines.

Each function measures one thing once and returns one number; the caller runs
it in interleaved rounds and keeps min/median/max. Nothing here asserts speed.
Databases are long-lived (warm) files or PostgreSQL databases made once per
run: each round adds to the same database, as a long-running engine would.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time

import durably

# The workloads and baselines ``durably bench`` times too live in the package:
# ``python -m benchmarks`` times the same ones.
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


# --- several worker processes on one database ------------------------------------------------


async def processes_throughput(url: str, procs: int, in_flight: int, total: int) -> float:
    """1-step workflows finished per second by ``procs`` worker processes on one database.

    Each child opens an engine, warms it up and says ``ready``; once all are ready they
    are told ``go`` at once and each runs ``total`` workflows, ``in_flight`` at a time
    (as :func:`throughput`). Timed here, from ``go`` until the last child is done.
    """
    argv = [sys.executable, "-m", "benchmarks.workloads", "procs-child", url]
    argv += [str(in_flight), str(total)]
    children = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.to_thread(child.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError(f"a worker process did not get ready: {line!r}")
        t0 = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None
            line = await asyncio.to_thread(child.stdout.readline)
            if line.strip() != "done":
                raise RuntimeError(f"a worker process failed: {line!r}")
        elapsed = time.perf_counter() - t0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    return procs * total / elapsed


async def _procs_child(url: str, in_flight: int, total: int) -> None:
    async with durably.Engine(url, poll_interval=60.0) as engine:
        await throughput(engine, 1, min(in_flight, 10), min(total, 20))  # warm-up
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await throughput(engine, 1, in_flight, total)
        print("done", flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["procs-child"]:
    asyncio.run(_procs_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
