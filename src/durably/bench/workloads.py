"""The workloads ``durably bench`` times, and the raw baselines it times beside them.

Each measurement runs one thing once and returns one number; the caller runs it in
interleaved rounds and keeps min/median/max. The repository's ``python -m
benchmarks`` times the same workloads (and adds DBOS and more sizes); the recovery
and processes rows are in :mod:`durably.bench.recovery` and :mod:`durably.bench.processes`.
Nothing here asserts speed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import statistics
import time
from typing import Any

import durably

#: The result every benchmark step returns (``n`` set to the step's index).
PAYLOAD: dict[str, Any] = {"ok": True, "n": 0, "text": "a small result"}
PAYLOAD_JSON = json.dumps(PAYLOAD, separators=(",", ":"))

_spans: list[tuple[float, float]] = []  # (first step began, last step ended) per pass
_signal_seen: list[float] = []  # perf_counter when wait_for_signal returned

# --- workflows ----------------------------------------------------------------------------


@durably.step
async def bench_step(i: int) -> dict[str, Any]:
    """A plain async step returning a small dict."""
    return {**PAYLOAD, "n": i}


@durably.step
def bench_sync_step(i: int) -> dict[str, Any]:
    """The same step as a plain ``def``: it runs on one of the engine's step threads."""
    return {**PAYLOAD, "n": i}


async def _timed(step: Any, steps: int) -> None:
    """Call ``step`` ``steps`` times, noting when the first began and the last ended."""
    t0 = time.perf_counter()
    for i in range(steps):
        await step(i)
    _spans.append((t0, time.perf_counter()))


@durably.workflow(name="bench-steps")
async def steps_workflow(steps: int) -> int:
    """``steps`` async steps, timed from just before the first to just after the last."""
    await _timed(bench_step, steps)
    return steps


@durably.workflow(name="bench-sync-steps")
async def sync_steps_workflow(steps: int) -> int:
    """``steps`` sync steps, timed as ``steps_workflow``."""
    await _timed(bench_sync_step, steps)
    return steps


@durably.workflow(name="bench-replay")
async def replay_workflow(steps: int) -> int:
    """``steps`` steps, then a signal wait: the signal re-runs it from the top on them."""
    await _timed(bench_step, steps)
    await durably.wait_for_signal("go")
    return steps


@durably.workflow(name="bench-signal")
async def signal_workflow() -> None:
    """Park on a signal; note when it arrives."""
    await durably.wait_for_signal("go")
    _signal_seen.append(time.perf_counter())


# --- baselines ----------------------------------------------------------------------------


class _RawTable:
    """A table of one-row commits on one connection, read back as replay reads a journal;
    each dialect gives its statements (``BEGIN``, ``INSERT``, ``SELECT`` of the last rows)."""

    conn: Any
    begin: str
    insert: str
    last_rows: str

    def __init__(self, table: str, warm: int) -> None:
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (workflow_id TEXT NOT NULL, "
            "seq BIGINT NOT NULL, payload TEXT, PRIMARY KEY (workflow_id, seq))"
        )
        self.seq = 0
        self.commit_us(warm)  # warm the file (or server), the WAL and the statement cache

    def commit_us(self, n: int) -> float:
        """Mean microseconds of ``BEGIN; INSERT; COMMIT`` of one row, each waited for."""
        t0 = time.perf_counter()
        for _ in range(n):
            self.seq += 1
            self.conn.execute(self.begin)
            self.conn.execute(self.insert, (self.seq, PAYLOAD_JSON))
            self.conn.execute("COMMIT")
        return (time.perf_counter() - t0) / n * 1e6

    def read_us(self, n: int) -> float:
        """Microseconds per row to read back the last ``n`` rows and decode their JSON."""
        t0 = time.perf_counter()
        rows = self.conn.execute(self.last_rows, (n,)).fetchall()
        for _, payload in rows:
            json.loads(payload)
        return (time.perf_counter() - t0) / max(1, len(rows)) * 1e6

    def close(self) -> None:
        self.conn.close()


class RawSqlite(_RawTable):
    """One warm SQLite file written one committed row at a time: the floor of a step."""

    def __init__(self, path: str, synchronous: str) -> None:
        # Used from a worker thread (asyncio.to_thread), off the engines' event loop.
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        self.begin = "BEGIN IMMEDIATE"
        self.insert = "INSERT INTO journal VALUES ('wf', ?, ?)"
        self.last_rows = (
            "SELECT seq, payload FROM journal WHERE workflow_id = 'wf' ORDER BY seq DESC LIMIT ?"
        )
        super().__init__("journal", 200)


class RawPostgres(_RawTable):
    """One psycopg connection doing ``BEGIN; INSERT; COMMIT`` per row: the PostgreSQL floor.

    ``conninfo`` is libpq's (durably's own URL options taken out); ``table`` may name
    its schema.
    """

    def __init__(self, conninfo: str, table: str = "raw_journal") -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.begin = "BEGIN"
        self.insert = f"INSERT INTO {table} VALUES ('wf', %s, %s)"
        self.last_rows = (
            f"SELECT seq, payload FROM {table} WHERE workflow_id = 'wf' ORDER BY seq DESC LIMIT %s"
        )
        super().__init__(table, 100)


Raw = RawSqlite | RawPostgres

# --- durably measurements -------------------------------------------------------------------


async def step_us(engine: durably.Engine, steps: int) -> float:
    """Microseconds per plain async step, timed inside one workflow of ``steps`` steps."""
    _spans.clear()
    await (await engine.start(steps_workflow, steps)).result()
    ((t0, t1),) = _spans
    return (t1 - t0) / steps * 1e6


async def sync_step_us(engine: durably.Engine, steps: int) -> float:
    """Microseconds per plain ``def`` step, timed like ``step_us``."""
    _spans.clear()
    await (await engine.start(sync_steps_workflow, steps)).result()
    ((t0, t1),) = _spans
    return (t1 - t0) / steps * 1e6


async def throughput(engine: durably.Engine, steps: int, in_flight: int, total: int) -> float:
    """Workflows of ``steps`` steps finished per second, ``in_flight`` at a time."""
    left = [total]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            await (await engine.start(steps_workflow, steps)).result()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return total / (time.perf_counter() - t0)


async def replay_us(engine: durably.Engine, steps: int) -> float:
    """Microseconds per recorded step when a parked workflow of ``steps`` steps re-runs."""
    _spans.clear()
    handle = await engine.start(replay_workflow, steps)
    await _until_parked(handle)
    await engine.send_signal(handle.workflow_id, "go")
    await handle.result()
    if len(_spans) < 2:
        raise RuntimeError("the workflow did not re-run from its first line after the signal")
    t0, t1 = _spans[-1]
    return (t1 - t0) / steps * 1e6


async def signal_us(engine: durably.Engine, n: int) -> float:
    """Microseconds from ``send_signal`` being called to the parked workflow holding it:
    the median of ``n`` wake-ups, each of a workflow started and parked for it."""
    took = []
    for _ in range(n):
        _signal_seen.clear()
        handle = await engine.start(signal_workflow)
        await _until_parked(handle)
        t0 = time.perf_counter()
        await engine.send_signal(handle.workflow_id, "go")
        await handle.result()
        took.append((_signal_seen[-1] - t0) * 1e6)
    return statistics.median(took)


async def _until_parked(handle: durably.WorkflowHandle, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while await handle.status() != durably.Status.WAITING:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handle.workflow_id} did not park within {timeout} s")
        await asyncio.sleep(0.001)
