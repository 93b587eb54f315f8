"""Sync ``def`` steps against async ones, with 1, 10 and 100 workflows in flight.

    python -m benchmarks.sync_steps [--in-flight 1 10 100] [--workflows 600] [--rounds 3]
                                    [--synchronous normal] [--postgres URL]

Each workflow runs ``--steps`` plain steps that return their argument: async ones on
the event loop, or sync ones on the engine's step threads. One engine a kind and a
round, on a fresh SQLite file (or a fresh schema of the ``--postgres`` database: the
role needs ``CREATE``); the two kinds alternate within each round. A cell is
``median [min-max]`` workflows a second over the rounds, and the ratio is the sync
median over the async one (the baseline: 1.0 would mean a sync step costs nothing
more). Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid

import durably
from benchmarks.statements import _directory, _positive


@durably.step(name="bench.sync_steps.on_loop")
async def on_loop(i: int) -> int:
    return i


@durably.step(name="bench.sync_steps.on_thread")
def on_thread(i: int) -> int:
    return i


@durably.workflow(name="bench.sync_steps.async_steps")
async def async_steps(n: int) -> int:
    return sum([await on_loop(i) for i in range(n)])


@durably.workflow(name="bench.sync_steps.sync_steps")
async def sync_steps(n: int) -> int:
    return sum([await on_thread(i) for i in range(n)])


async def _throughput(url: str, sync: bool, workflows: int, steps: int, in_flight: int) -> float:
    """Workflows a second, ``in_flight`` at a time, after one untimed workflow."""
    flow = sync_steps if sync else async_steps
    async with durably.Engine(url) as engine:
        await (await engine.start(flow, steps)).result()
        lanes = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with lanes:
                await (await engine.start(flow, steps)).result()

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(workflows)))
        return workflows / (time.perf_counter() - began)


def _url(where: str, postgres: str | None, mode: str, name: str) -> str:
    if postgres is None:
        return f"sqlite:///{urllib.parse.quote(where)}/{name}.db?synchronous={mode}"
    sep = "&" if "?" in postgres else "?"
    return f"{postgres}{sep}schema=bench_sync_{name}_{uuid.uuid4().hex[:8]}"


def _drop_schemas(postgres: str) -> None:
    import psycopg

    with psycopg.connect(postgres.split("?")[0], autocommit=True) as conn:
        found = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_sync_%'"
        ).fetchall()
        for (schema,) in found:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"


def main(argv: list[str] | None = None) -> int:
    """Measure every in-flight count, then print one table (80 columns)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sync_steps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--in-flight", type=_positive, nargs="+", default=[1, 10, 100])
    parser.add_argument("--workflows", type=_positive, default=600, help="a measurement")
    parser.add_argument("--steps", type=_positive, default=10, help="a workflow's steps")
    parser.add_argument("--rounds", type=_positive, default=3)
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal")
    parser.add_argument("--postgres", metavar="URL", help="a database to measure in instead")
    parser.add_argument("--dir", type=_directory, help="parent of the temp dir for SQLite")
    args = parser.parse_args(argv)
    measured: dict[tuple[int, bool], list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="durably-sync-steps-", dir=args.dir) as d:
            for round_ in range(args.rounds):
                for lanes in args.in_flight:
                    for sync in (False, True) if round_ % 2 == 0 else (True, False):
                        name = f"{'sync' if sync else 'async'}_{lanes}_{round_}"
                        url = _url(d, args.postgres, args.synchronous, name)
                        rate = asyncio.run(
                            _throughput(url, sync, args.workflows, args.steps, lanes)
                        )
                        measured.setdefault((lanes, sync), []).append(rate)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        if args.postgres is not None:
            _drop_schemas(args.postgres)
    where = "PostgreSQL" if args.postgres else f"SQLite {args.synchronous.upper()}"
    print("durably sync steps (python -m benchmarks.sync_steps)")
    print(
        f"durably {durably.__version__}, Python {platform.python_version()}, {where}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{args.steps}-step workflows a second, {args.workflows} a measurement, ", end="")
    print(f"median [min-max] of {args.rounds} rounds")
    print()
    print(f"{'in flight':>9}  {'async steps':<18}  {'sync steps':<18}  sync/async")
    for lanes in args.in_flight:
        on_loop_, on_threads = measured[(lanes, False)], measured[(lanes, True)]
        ratio = statistics.median(on_threads) / statistics.median(on_loop_)
        print(f"{lanes:>9}  {_cell(on_loop_):<18}  {_cell(on_threads):<18}  {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
