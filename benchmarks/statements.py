"""Where a step's and a workflow's time goes on SQLite, statement by statement.

    python -m benchmarks.statements [--steps 2000] [--workflows 1000] [--synchronous normal]

Three measurements, each on a warm file in one temp directory:

- **in the engine**: one workflow of ``--steps`` plain async steps, then
  ``--workflows`` 1-step workflows one after another, with every statement the
  store sends timed where it is executed (this engine's store instance has its
  ``_execute`` wrapped; the wrapper's own cost, measured beforehand, is taken off
  the time outside the statements): per statement, how many a step (or a
  workflow) sends and what each costs; then, in a second, untimed pass with the
  WAL's automatic checkpoint off (a growing WAL file makes each commit dearer),
  the WAL pages each writes;
- **raw, tight**: the raw baseline of ``python -m benchmarks``, ``BEGIN
  IMMEDIATE; INSERT; COMMIT`` of one row in a loop, each statement timed;
- **raw, Python between**: the same loop with pure-Python work before each
  statement (encoding and decoding payloads like a step's), for as long in all as
  a step spends outside its statements: whether the same statements cost more
  when other work runs between them, as in any program.

The two raw loops run in alternating blocks, and each figure is the median over
the blocks (the totals also give their min and max). The time outside a step's
statements also counts what the driver does after ``execute`` returns (reading
a row), and the step's ``COMMIT`` and ``BEGIN`` counts include its workflow's
start and finish (2 in ``--steps``). Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import durably
from benchmarks import workloads

#: The header of a WAL frame (then a page).
_FRAME_HEADER = 24
#: Alternating blocks of the two raw loops.
_BLOCKS = 6


class StatementClock:
    """Times every statement one SQLite store executes, by the query it runs."""

    def __init__(self, engine: durably.Engine) -> None:
        store: Any = engine._store.store  # a benchmark: this instance only
        self.store = store
        self.names = {text: name for name, text in store._queries.items()}
        self.took: dict[str, float] = collections.defaultdict(float)
        self.count: collections.Counter[str] = collections.Counter()
        store._execute = self._wrap(store._execute)
        self.overhead_us = self._overhead_us()

    def _wrap(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(sql_text: str, params: Any = None) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(sql_text, params)
            finally:
                name = self.names.get(sql_text) or sql_text.split("=")[0].strip()
                self.took[name] += time.perf_counter() - t0
                self.count[name] += 1

        return timed

    def _overhead_us(self) -> float:
        """What the wrapper adds to a statement outside its timed part (µs): a wrapped
        no-op against the bare one, the smaller of three tries."""

        def noop(sql_text: str, params: Any = None) -> None:
            return None

        wrapped, n, best = self._wrap(noop), 20000, float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                noop("COMMIT")
            t1 = time.perf_counter()
            for _ in range(n):
                wrapped("COMMIT")
            best = min(best, ((time.perf_counter() - t1) - (t1 - t0)) / n * 1e6)
        self.reset()
        return max(best, 0.0)

    def reset(self) -> None:
        self.took.clear()
        self.count.clear()

    @contextmanager
    def wal_pages(self, out: list[float]) -> Iterator[None]:
        """Count the WAL pages written inside the block (no checkpoint meanwhile). The
        engine must be idle around it: these statements go to its connection directly."""
        conn: sqlite3.Connection = self.store.conn
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (every,) = conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        try:
            yield
            size = os.path.getsize(self.store.path + "-wal")
            out.append(size / (page_size + _FRAME_HEADER))
        finally:
            conn.execute(f"PRAGMA wal_autocheckpoint = {int(every)}")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def rows(self, per: int) -> list[tuple[str, float, float]]:
        """(statement, how many per unit, µs each), costliest in all first."""
        found = [(n, self.count[n] / per, self.took[n] / self.count[n] * 1e6) for n in self.took]
        return sorted(found, key=lambda r: -r[1] * r[2])


def _raw_blocks(
    path_of: Callable[[str], str], synchronous: str, n: int, chore: Callable[[], None]
) -> dict[str, list[dict[str, float]]]:
    """The raw loop, tight and with ``chore`` before each statement, in alternating
    blocks of ``n`` commits: µs per statement of each block, by loop."""
    loops = {
        "tight loop": workloads.RawSqlite(path_of("tight"), synchronous),
        "Python between": workloads.RawSqlite(path_of("between"), synchronous),
    }
    found: dict[str, list[dict[str, float]]] = {label: [] for label in loops}
    try:
        for _ in range(_BLOCKS):
            for label, raw in loops.items():
                between = chore if label == "Python between" else None
                found[label].append(_raw(raw, n, between))
    finally:
        for raw in loops.values():
            raw.close()
    return found


def _raw(raw: workloads.RawSqlite, n: int, between: Callable[[], None] | None) -> dict[str, float]:
    """µs per statement of ``n`` commits of the raw loop, ``between`` called before each."""
    took: dict[str, float] = collections.defaultdict(float)
    conn = raw.conn
    for _ in range(n):
        raw.seq += 1
        insert = (raw.seq, workloads.PAYLOAD_JSON)
        for name, sql_text, params in (
            ("BEGIN IMMEDIATE", "BEGIN IMMEDIATE", ()),
            ("INSERT", "INSERT INTO journal VALUES ('wf', ?, ?)", insert),
            ("COMMIT", "COMMIT", ()),
        ):
            if between is not None:
                between()
            t0 = time.perf_counter()
            conn.execute(sql_text, params)
            took[name] += time.perf_counter() - t0
    return {name: t / n * 1e6 for name, t in took.items()}


def _python_work(us: float) -> Callable[[], None]:
    """A pure-Python chore of about ``us`` / 3 µs (one before each of 3 statements):
    encoding and decoding payloads like the step's, taken in turn from a pool of
    distinct ones, as a program touches more than one object between two commits."""
    pool = [{**workloads.PAYLOAD, "n": i, "items": list(range(i, i + 20)), "text": f"{i:050}"}
            for i in range(512)]  # fmt: skip
    at = [0]

    def once() -> None:
        at[0] = (at[0] + 1) % len(pool)
        json.loads(json.dumps(pool[at[0]]))

    t0 = time.perf_counter()
    for _ in range(2000):
        once()
    each = (time.perf_counter() - t0) / 2000 * 1e6
    times = max(1, round(us / 3 / max(each, 0.1)))

    def chore() -> None:
        for _ in range(times):
            once()

    return chore


async def _engine_side(url: str, steps: int, workflows: int) -> dict[str, Any]:
    """Statements timed in one pass, WAL pages counted in another."""
    # no heartbeat during the run: its commits would land among the ones counted
    async with durably.Engine(url, poll_interval=60.0, lease_seconds=3600.0) as engine:
        clock = StatementClock(engine)
        await workloads.step_us(engine, 200)  # warm-up: the file, the WAL, the statements
        await workloads.throughput(engine, 1, 1, 200)
        out: dict[str, Any] = {}
        clock.reset()
        out["step_us"] = await workloads.step_us(engine, steps)
        # the step's own statements: its workflow's start and finish are shared by them all
        out["step_rows"] = [r for r in clock.rows(steps) if r[1] >= 0.5]
        sent = sum(per for _, per, _ in out["step_rows"])
        in_statements = sum(per * us for _, per, us in out["step_rows"])
        # outside the statements a sequential step runs only Python: the engine's own
        out["python_us"] = out["step_us"] - in_statements - sent * clock.overhead_us
        out["overhead_us"] = clock.overhead_us
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
    """One table: each statement's count per unit, its µs each and per unit, and their sum
    against ``total_us``, the unit's whole time."""
    print(title)
    print(f"  {'statement':<28} {'per unit':>8} {'us each':>8} {'us per unit':>11}")
    sql = 0.0
    for name, per, each in rows:
        sql += per * each
        print(f"  {name[:28]:<28} {per:8.2f} {each:8.1f} {per * each:11.1f}")
    print(f"  {'all statements':<28} {sql:28.1f} of {total_us:.0f} us in all")


def _positive(text: str) -> int:
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _directory(text: str) -> str:
    """An argparse type: a directory that exists."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return text


def main(argv: list[str] | None = None) -> int:
    """Measure, then print the three measurements (80 columns)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.statements", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=_positive, default=2000, help="steps of the timed workflow")
    parser.add_argument(
        "--workflows", type=_positive, default=1000, help="1-step workflows, in turn"
    )
    parser.add_argument(
        "--synchronous", choices=("normal", "full"), default="normal", help="SQLite's (normal)"
    )
    parser.add_argument(
        "--dir", type=_directory, help="parent of the temp dir for the SQLite files"
    )
    args = parser.parse_args(argv)
    mode = args.synchronous
    with tempfile.TemporaryDirectory(prefix="durably-statements-", dir=args.dir) as d:
        url = f"sqlite:///{urllib.parse.quote(d)}/engine.db?synchronous={mode}"
        engine = asyncio.run(_engine_side(url, args.steps, args.workflows))
        python_us = max(engine["python_us"], 1.0)  # the engine's own, per step
        per_block = max(args.steps // _BLOCKS, 100)
        raw = _raw_blocks(
            lambda name: os.path.join(d, f"raw-{name}.db"), mode, per_block, _python_work(python_us)
        )
    print("durably statements (python -m benchmarks.statements)")
    print(
        f"durably {durably.__version__}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, synchronous={mode},\n{os.cpu_count()} CPUs, "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print()
    _print_rows(
        f"a step, in a workflow of {args.steps} steps: us per step,\n"
        f"{engine['python_us']:.1f} us outside the statements "
        f"(the timing's {engine['overhead_us']:.2f} us a statement taken off),\n"
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
    print(f"the raw baseline's statements, us each, medians of {_BLOCKS} alternating blocks")
    print(f"of {per_block} commits (all: median [min-max]):")
    for label, blocks in raw.items():
        each = {k: statistics.median(b[k] for b in blocks) for k in blocks[0]}
        totals = [sum(b.values()) for b in blocks]
        cells = " ".join(f"{k} {v:.1f}" for k, v in each.items())
        print(f"  {label:<14} {cells}")
        print(
            f"  {'':<14} all {statistics.median(totals):.1f} [{min(totals):.1f}-{max(totals):.1f}]"
        )
    print(f"  (Python between: {python_us:.0f} us of encoding and decoding payloads a")
    print("  commit, a step's time outside its statements above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
