"""Throughput of several worker processes on one database, against one such process.

Each child (``python -m durably.bench.processes IN_FLIGHT TOTAL``, the database's URL
in its environment, never its command line) opens an engine, warms it up and says
``ready``; once every child is ready they are all told ``go`` at once, and each runs
TOTAL 1-step workflows, IN_FLIGHT at a time, then says ``done``. The time is taken
here, from ``go`` until the last child is done: what adding worker processes buys on
this machine and database (on PostgreSQL, the deployment docs' question; on SQLite,
one file takes one writer at a time).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import durably
from durably.bench.workloads import throughput

#: The child's database URL (it may hold a password: never on a command line).
_URL = "DURABLY_BENCH_URL"


async def processes_throughput(
    url: str, procs: int, in_flight: int, total: int, timeout: float = 600.0
) -> float:
    """1-step workflows finished per second by ``procs`` worker processes on ``url``,
    each running ``total`` of them ``in_flight`` at a time."""
    argv = [sys.executable, "-m", "durably.bench.processes", str(in_flight), str(total)]
    env = {**os.environ, _URL: url}
    children = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        for _ in range(procs)
    ]
    try:
        async with asyncio.timeout(timeout):
            await _each_says(children, "ready")
            t0 = time.perf_counter()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            await _each_says(children, "done")
            elapsed = time.perf_counter() - t0
    finally:
        for child in children:  # (a child that failed or hangs: its readline ends here)
            if child.poll() is None:
                child.kill()
            child.wait()
    return procs * total / elapsed


async def _each_says(children: list[subprocess.Popen[str]], word: str) -> None:
    """Wait until every child has printed ``word``; RuntimeError if one printed else or
    ended (its error went to stderr, which it shares with this process)."""
    for child in children:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        if line.strip() != word:
            if line:
                said = f"said {line.strip()!r}"
            else:
                said = f"ended (exit status {await asyncio.to_thread(child.wait)})"
            raise RuntimeError(f"a worker process {said} where it should say {word!r}")


async def _child(url: str, in_flight: int, total: int) -> None:
    async with durably.Engine(url, poll_interval=60.0) as engine:
        await throughput(engine, 1, min(in_flight, 10), min(total, 20))  # warm-up
        print("ready", flush=True)
        if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
            return  # the parent ended (its end of the pipe closed): run nothing
        await throughput(engine, 1, in_flight, total)
        print("done", flush=True)


if __name__ == "__main__":
    # A Ctrl-C at the terminal reaches the whole process group: the parent stops the run
    # and kills its children, which need not each print a traceback of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_child(os.environ[_URL], int(sys.argv[1]), int(sys.argv[2])))
