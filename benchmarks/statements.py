"""Where a step's and a workflow's time goes on SQLite, statement by statement.

    python -m benchmarks.statements [--steps 2000] [--workflows 1000] [--synchronous normal]

Three measurements, each on a warm file in one temp directory:

- **in the engine**: one workflow of ``--steps`` plain async steps, then
  ``--workflows`` 1-step workflows one after another, with every statement the
  store sends timed where it is executed (this instance's ``_execute`` wrapped):
  per statement, how many a step (or a workflow) sends and what each costs, and
  the WAL pages each commit writes (read from the WAL in a second, untimed
  pass with its automatic checkpoint off);
- **raw, tight**: the raw baseline of ``python -m benchmarks``, ``BEGIN
  IMMEDIATE; INSERT; COMMIT`` of one row in a loop, each statement timed;
- **raw, Python between**: the same loop with pure-Python work between the
  statements (encoding and decoding payloads like the step's, for as long as a
  step spends outside its statements: the engine's own Python): the
  statements alone then cost what they cost
  inside a program, whose Python evicts SQLite's code and pages from the CPU's
  caches between two commits.

The third line is why a step cannot reach a small multiple of the tight loop's
commit, whatever the engine's own Python costs: docs/performance.md (tenth pass).
Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import durably
from benchmarks import workloads

#: WAL frame: a page and its 24-byte header.
_FRAME_HEADER = 24


class StatementClock:
    """Times every statement one SQLite store executes, by the query it runs."""

    def __init__(self, engine: durably.Engine) -> None:
        store: Any = engine._store.store  # a benchmark: this instance only
        self.store = store
        self.names = {text: name for name, text in store._queries.items()}
        self.took: dict[str, float] = collections.defaultdict(float)
        self.count: collections.Counter[str] = collections.Counter()
        inner: Callable[..., Any] = store._execute

        def timed(sql_text: str, params: Any = None) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(sql_text, params)
            finally:
                name = self.names.get(sql_text) or sql_text.split("=")[0].strip()
                self.took[name] += time.perf_counter() - t0
                self.count[name] += 1

        store._execute = timed

    def reset(self) -> None:
        self.took.clear()
        self.count.clear()

    @contextmanager
    def wal_pages(self, out: list[float]) -> Iterator[None]:
        """Count the WAL frames written inside the block (no checkpoint meanwhile)."""
        conn: sqlite3.Connection = self.store.conn
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        try:
            yield
            out.append(os.path.getsize(self.store.path + "-wal") / (4096 + _FRAME_HEADER))
        finally:
            conn.execute("PRAGMA wal_autocheckpoint = 1000")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def rows(self, per: int) -> list[tuple[str, float, float]]:
        """(statement, how many per unit, µs each), costliest in all first."""
        found = [(n, self.count[n] / per, self.took[n] / self.count[n] * 1e6) for n in self.took]
        return sorted(found, key=lambda r: -r[1] * r[2])


def _raw(
    path: str, synchronous: str, n: int, between: Callable[[], object] | None
) -> dict[str, float]:
    """µs per statement of the raw baseline's loop, ``between`` called before each."""
    raw = workloads.RawSqlite(path, synchronous)
    took: dict[str, float] = collections.defaultdict(float)
    conn = raw.conn
    try:
        for _ in range(n):
            raw.seq += 1
            for name, sql_text, params in (
                ("BEGIN IMMEDIATE", "BEGIN IMMEDIATE", ()),
                (
                    "INSERT",
                    "INSERT INTO journal VALUES ('wf', ?, ?)",
                    (raw.seq, workloads.PAYLOAD_JSON),
                ),
                ("COMMIT", "COMMIT", ()),
            ):
                if between is not None:
                    between()
                t0 = time.perf_counter()
                conn.execute(sql_text, params)
                took[name] += time.perf_counter() - t0
    finally:
        raw.close()
    return {name: t / n * 1e6 for name, t in took.items()}


def _python_work(cpu_us: float) -> Callable[[], None]:
    """A pure-Python chore of about ``cpu_us`` / 3 µs (one before each of 3 statements):
    encoding and decoding payloads like the step's, taken in turn from a pool of
    distinct ones, as a program touches more than one object between two commits."""
    pool = [{**workloads.PAYLOAD, "n": i, "items": list(range(i, i + 20)), "text": f"{i:050}"}
            for i in range(512)]  # fmt: skip
    at = [0]

    def once() -> None:
        at[0] = (at[0] + 1) % len(pool)
        json.loads(json.dumps(pool[at[0]]))

    t0 = time.thread_time()
    for _ in range(2000):
        once()
    each = (time.thread_time() - t0) / 2000 * 1e6
    times = max(1, round(cpu_us / 3 / max(each, 0.1)))

    def chore() -> None:
        for _ in range(times):
            once()

    return chore


async def _engine_side(url: str, steps: int, workflows: int) -> dict[str, Any]:
    """Statements timed in one pass, WAL pages counted in another: with its checkpoint
    off the WAL file grows, which makes each commit (a FULL one's fsync) costlier."""
    async with durably.Engine(url, poll_interval=60.0) as engine:
        clock = StatementClock(engine)
        await workloads.step_us(engine, 200)  # warm-up: the file, the WAL, the statements
        await workloads.throughput(engine, 1, 1, 200)
        out: dict[str, Any] = {}
        clock.reset()
        out["step_us"] = await workloads.step_us(engine, steps)
        out["step_rows"] = clock.rows(steps)
        # outside the statements a sequential step only runs Python: the engine's own
        out["python_us"] = out["step_us"] - sum(per * us for _, per, us in out["step_rows"])
        clock.reset()
        t0 = time.perf_counter()
        await workloads.throughput(engine, 1, 1, workflows)
        out["wf_us"] = (time.perf_counter() - t0) / workflows * 1e6
        out["wf_rows"] = clock.rows(workflows)
        pages: list[float] = []
        with clock.wal_pages(pages):
            await workloads.step_us(engine, steps)
        with clock.wal_pages(pages):
            await workloads.throughput(engine, 1, 1, workflows)
        out["step_pages"], out["wf_pages"] = pages[0] / steps, pages[1] / workflows
        return out


def _print_rows(title: str, rows: list[tuple[str, float, float]], total_us: float) -> None:
    print(title)
    print(f"  {'statement':<28} {'per unit':>8} {'us each':>8} {'us per unit':>11}")
    sql = 0.0
    for name, per, each in rows:
        sql += per * each
        print(f"  {name[:28]:<28} {per:8.2f} {each:8.1f} {per * each:11.1f}")
    print(f"  {'all statements':<28} {'':>8} {'':>8} {sql:11.1f}  of {total_us:.1f} us in all")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_positive, default=2000, help="steps of the timed workflow")
    parser.add_argument(
        "--workflows", type=_positive, default=1000, help="1-step workflows, in turn"
    )
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal")
    parser.add_argument("--dir", help="parent of the temp dir for the SQLite files")
    args = parser.parse_args(argv)
    mode = args.synchronous
    with tempfile.TemporaryDirectory(prefix="durably-statements-", dir=args.dir) as d:
        url = f"sqlite:///{d}/engine.db?synchronous={mode}"
        engine = asyncio.run(_engine_side(url, args.steps, args.workflows))
        n = max(args.steps, 1000)
        tight = _raw(f"{d}/raw-tight.db", mode, n, None)
        python_us = max(engine["python_us"], 1.0)  # the engine's own, per step
        chore = _python_work(python_us)
        between = _raw(f"{d}/raw-between.db", mode, n, chore)
    print("durably statements (python -m benchmarks.statements)")
    print(
        f"durably {durably.__version__}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, synchronous={mode},\n{os.cpu_count()} CPUs, "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print()
    _print_rows(
        f"a step, in a workflow of {args.steps} steps: us per step,\n"
        f"{engine['python_us']:.1f} us outside the statements, "
        f"{engine['step_pages']:.2f} WAL pages a step",
        engine["step_rows"],
        engine["step_us"],
    )
    print()
    _print_rows(
        f"a 1-step workflow, start to result, {args.workflows} in turn: us per workflow,\n"
        f"{engine['wf_pages']:.2f} WAL pages a workflow",
        engine["wf_rows"],
        engine["wf_us"],
    )
    print()
    print("the raw baseline's statements, us each (BEGIN IMMEDIATE; INSERT; COMMIT):")
    for label, found in (("tight loop", tight), ("Python between", between)):
        cells = " ".join(f"{k} {v:5.1f}" for k, v in found.items())
        print(f"  {label:<14} {cells} all {sum(found.values()):5.1f}")
    print(f"  (Python between: {python_us:.0f} us of encoding and decoding payloads a commit,")
    print("  a step's time outside its statements above: the engine's own Python)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
