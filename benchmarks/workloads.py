"""The durably workloads of ``python -m benchmarks`` and their same-run baselines.

Each function measures one thing once and returns one number; the caller runs
it in interleaved rounds and keeps min/median/max. Nothing here asserts speed.
Databases are long-lived (warm) files or PostgreSQL databases made once per
run: each round adds to the same database, as a long-running engine would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time

import durably

# The workloads and baselines ``durably bench`` times too live in the package:
# ``python -m benchmarks`` times the same ones.
from durably.bench.workloads import (  # re-exported for __main__ and statements
    PAYLOAD,
    PAYLOAD_JSON,
    RawPostgres,
    RawSqlite,
    bench_step,
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

_blocked = 0  # recovery child: workflows parked in the blocking step
_CHILD = os.environ.get("DURABLY_BENCH_CHILD") == "1"


@durably.step
async def bench_block() -> None:
    """In the recovery child: hang here (the parent SIGKILLs it); elsewhere return at once."""
    global _blocked
    if _CHILD:
        _blocked += 1
        await asyncio.Event().wait()


@durably.workflow(name="bench-recover")
async def recover_workflow() -> int:
    await bench_step(0)
    await bench_block()
    await bench_step(1)
    return 2


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


# --- recovery of killed workflows: a child process that is SIGKILLed ------------------------


async def recovery_seconds(url: str, n: int, timeout: float = 600.0) -> float:
    """Seconds to finish ``n`` workflows left behind by a SIGKILLed process.

    A child process starts ``n`` workflows (ids ``recover-0`` ...) that each commit
    a step and then hang; once all hang it is SIGKILLed. A new engine in this
    process then recovers them (a dead executor on this host is seen at once):
    timed from opening the engine to the last one finished. ``url`` must be a
    database no other run has used.
    """
    env = {**os.environ, "DURABLY_BENCH_CHILD": "1"}
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.workloads", "recovery-child", url, str(n)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"the recovery child did not get ready: {line!r}")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return await _recover_all(url, n, timeout)


async def fresh_seconds(url: str, n: int) -> float:
    """The baseline of recovery: ``n`` fresh workflows of the same shape, started together."""
    return await _fresh_all(url, n)


async def _recover_all(url: str, n: int, timeout: float) -> float:
    t0 = time.perf_counter()
    async with durably.Engine(url, poll_interval=0.05) as engine:
        ids = [f"recover-{i}" for i in range(n)]
        deadline = time.monotonic() + timeout
        for wid in ids:
            left = max(0.001, deadline - time.monotonic())
            await engine.handle(wid).result(timeout=left)
        return time.perf_counter() - t0


async def _fresh_all(url: str, n: int) -> float:
    t0 = time.perf_counter()
    async with durably.Engine(url) as engine:
        handles = [await engine.start(recover_workflow) for _ in range(n)]
        for h in handles:
            await h.result()
        return time.perf_counter() - t0


async def _recovery_child(url: str, n: int) -> None:
    async with durably.Engine(url) as engine:
        for i in range(n):
            await engine.start(recover_workflow, workflow_id=f"recover-{i}")
        deadline = time.monotonic() + 600
        while _blocked < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {_blocked} of {n} workflows reached the blocking step")
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await asyncio.Event().wait()  # until SIGKILL


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


if __name__ == "__main__" and sys.argv[1:2] == ["recovery-child"]:
    asyncio.run(_recovery_child(sys.argv[2], int(sys.argv[3])))
if __name__ == "__main__" and sys.argv[1:2] == ["procs-child"]:
    asyncio.run(_procs_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
