"""``python -m benchmarks.replay_tasks``: the replay of tasks run at once, against one task.

    python -m benchmarks.replay_tasks [--steps 400] [--branches 1 4 20] [--rounds 5]

A workflow makes ``--steps`` plain steps, in one task or spread over ``--branches``
tasks of an ``asyncio.gather`` (whose journal holds ``follows``, so a replay matches
each call to its task's entry: ``replay.Replayer``), then parks on a signal. Another
Engine replays it when the signal comes; the time from the function's first line to
the end of its steps, on that replay, divided by the steps, is the replayed call's
cost. The baseline, in the same run, is the one task's journal, replayed in seq order.
SQLite, synchronous=NORMAL, median of ``--rounds``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import durably

_SPANS: list[float] = []


@durably.step
async def _work(i: int) -> int:
    return i


@durably.workflow(name="bench-replay-tasks")
async def _tasks(steps: int, branches: int) -> int:
    started = time.perf_counter()

    async def branch(b: int) -> int:
        return sum([await _work(i) for i in range(b, steps, branches)])

    total = sum(await asyncio.gather(*(branch(b) for b in range(branches))))
    _SPANS.append(time.perf_counter() - started)
    await durably.wait_for_signal("go")
    return total


async def _replayed(folder: str, steps: int, branches: int, n: int) -> float:
    """Microseconds a replayed call costs, for one workflow of ``branches`` tasks."""
    url = f"sqlite:///{folder}/r{branches}-{n}.db?synchronous=normal"
    async with durably.Engine(url) as engine:
        handle = await engine.start(_tasks, steps, branches, workflow_id="wf")
        while (await handle.info()).status != "waiting":
            await asyncio.sleep(0.01)
    _SPANS.clear()
    async with durably.Engine(url) as engine:
        await engine.send_signal("wf", "go", None)
        await engine.handle("wf").result(timeout=60)
    return _SPANS[0] / steps * 1e6


async def main(args: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        rows = {b: [] for b in args.branches}  # type: dict[int, list[float]]
        for n in range(args.rounds):
            for b in args.branches:
                rows[b].append(await _replayed(folder, args.steps, b, n))
    base = statistics.median(rows[args.branches[0]])
    print(f"{args.steps} steps replayed, SQLite NORMAL, median of {args.rounds}")
    print(f"{'tasks':>6} {'us/call':>9} {'ratio':>7}")
    for b, spans in rows.items():
        us = statistics.median(spans)
        print(f"{b:>6} {us:>9.1f} {us / base:>7.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_tasks")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--branches", type=int, nargs="+", default=[1, 4, 20])
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
