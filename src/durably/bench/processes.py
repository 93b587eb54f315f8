"""Throughput of several worker processes on one database, against one such process.

Each child (``python -m durably.bench.processes IN_FLIGHT TOTAL``, the database's URL
in its environment, never its command line) opens an engine, warms it up and says
``ready``; once every child is ready they are all told ``go`` at once, and each runs
TOTAL 1-step workflows, IN_FLIGHT at a time, then says ``done``. The time is taken
here, from ``go`` until the last child is done: what adding worker processes buys on
this machine and database (on PostgreSQL, the deployment docs' question; on SQLite,
one file takes one writer at a time). ``start_child`` and ``close_pipes`` serve the
recovery row's child too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time

import durably
from durably.bench.workloads import throughput

#: The variable that gives a child its database URL (it may hold a password: never on a
#: command line, which any local user can read).
URL_VARIABLE = "DURABLY_BENCH_URL"


def start_child(module: str, args: list[str], url: str, **env: str) -> subprocess.Popen[str]:
    """``python -m module *args``, with ``url`` (and ``env``) in its environment and pipes
    to its stdin and stdout. In a process group of its own: a Ctrl-C at the terminal
    reaches this process alone, which stops it; and its stdin's end closes if this
    process dies, which a child may watch for."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **env, URL_VARIABLE: url},
        text=True,
        process_group=0,
    )


async def processes_throughput(
    url: str, procs: int, in_flight: int, total: int, timeout: float = 600.0
) -> float:
    """1-step workflows finished per second by ``procs`` worker processes on ``url``,
    each running ``total`` of them ``in_flight`` at a time.

    TimeoutError if they are not all done within ``timeout`` seconds of starting;
    RuntimeError, with the child's one-line error, if one fails. The children are in a
    process group of their own: a Ctrl-C at the terminal reaches this process alone,
    which stops them.
    """
    args = [str(in_flight), str(total)]
    children: list[subprocess.Popen[str]] = []
    try:
        for _ in range(procs):
            children.append(start_child("durably.bench.processes", args, url))
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
                for child in children:  # each closes its engine: let it, up to a while
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await asyncio.to_thread(child.wait, _CLOSING)
        except TimeoutError:
            raise TimeoutError(
                f"{procs} worker processes did not finish {total} workflows each within "
                f"{timeout:g} s"
            ) from None
    finally:
        # Every child killed first, then waited for: a second Ctrl-C while waiting for
        # one cannot leave the others running. (A readline still waiting ends here.)
        for child in children:
            if child.poll() is None:
                child.kill()
        for child in children:
            child.wait()
            close_pipes(child)
    return procs * total / elapsed


def close_pipes(child: subprocess.Popen[str]) -> None:
    """Close this side of an ended child's pipes (a garbage-collected open one warns)."""
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # (its last write may find no reader)
                pipe.close()


#: Seconds a worker process that said ``done`` has to close its engine before it is killed.
_CLOSING = 30.0


async def _each_says(children: list[subprocess.Popen[str]], word: str) -> None:
    """Wait until every child has printed ``word``; RuntimeError if one printed something
    else (its error) or ended."""
    for child in children:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        if line.strip() != word:
            if line:
                said = f"failed: {line.strip().removeprefix('error: ')}"
            else:
                said = f"ended (exit status {await asyncio.to_thread(child.wait)})"
            raise RuntimeError(f"a worker process {said}")


async def _child(url: str, in_flight: int, total: int) -> None:
    async with durably.Engine(url, poll_interval=60.0) as engine:
        await throughput(engine, 1, min(in_flight, 10), min(total, 20))  # warm-up
        print("ready", flush=True)
        if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
            return  # the parent ended (its end of the pipe closed): run nothing
        await throughput(engine, 1, in_flight, total)
        print("done", flush=True)


def _main() -> None:
    """The child: its failure is one line for the parent to show, not a traceback."""
    try:
        asyncio.run(_child(os.environ[URL_VARIABLE], int(sys.argv[1]), int(sys.argv[2])))
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    _main()
