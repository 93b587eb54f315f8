"""Recovery of workflows a killed process left mid-run, timed beside as many fresh ones.

A child process (``python -m durably.bench.recovery N``, the database's URL in its
environment, not its command line, which any local user can read) starts N workflows that
each commit a step and then hang in the next; once all hang it says ``ready`` and is
SIGKILLed. A new engine in this process then recovers them: a dead executor on this
host is seen at once, so the time is the claims, the replays and the rest of each
workflow. The baseline runs N fresh workflows of the same shape, started together.
Each measurement needs a database nothing else uses (the ids repeat).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import durably
from durably.bench.processes import URL_VARIABLE, close_pipes, start_child
from durably.bench.workloads import bench_step

_CHILD = os.environ.get("DURABLY_BENCH_CHILD") == "1"
_blocked = 0  # in the child: workflows parked in the blocking step


@durably.step
async def bench_block() -> None:
    """In the child: hang here (the parent SIGKILLs it); elsewhere return at once."""
    global _blocked
    if _CHILD:
        _blocked += 1
        await asyncio.Event().wait()


@durably.workflow(name="bench-recover")
async def recover_workflow() -> int:
    """A step, the step the child hangs in, a step."""
    await bench_step(0)
    await bench_block()
    await bench_step(1)
    return 2


async def recovery_seconds(url: str, n: int, timeout: float = 600.0) -> float:
    """Seconds to finish ``n`` workflows left behind by a SIGKILLed process, timed from
    opening an engine on ``url`` (a database no other run has used) until the last ends."""
    child = start_child("durably.bench.recovery", [str(n)], url, DURABLY_BENCH_CHILD="1")
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"the recovery child did not get ready: {line!r}")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        close_pipes(child)
    t0 = time.perf_counter()
    async with durably.Engine(url, poll_interval=0.05) as engine:
        deadline = time.monotonic() + timeout
        for i in range(n):
            left = max(0.001, deadline - time.monotonic())
            await engine.handle(f"recover-{i}").result(timeout=left)
        return time.perf_counter() - t0


async def fresh_seconds(url: str, n: int) -> float:
    """The baseline: seconds to run ``n`` fresh workflows of the same shape, started together,
    timed from opening an engine on ``url``."""
    t0 = time.perf_counter()
    async with durably.Engine(url) as engine:
        handles = [await engine.start(recover_workflow) for _ in range(n)]
        for handle in handles:
            await handle.result()
        return time.perf_counter() - t0


async def _child(url: str, n: int) -> None:
    async with durably.Engine(url) as engine:
        for i in range(n):
            await engine.start(recover_workflow, workflow_id=f"recover-{i}")
        deadline = time.monotonic() + 600
        while _blocked < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {_blocked} of {n} workflows reached the blocking step")
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # until SIGKILL, or the parent is gone
        os.kill(os.getpid(), signal.SIGKILL)  # then as if killed: nothing let go of


if __name__ == "__main__":
    asyncio.run(_child(os.environ[URL_VARIABLE], int(sys.argv[1])))
