"""The threads sync steps run on (durably.step_threads), alone and under an engine.

A step the loop's thread waits for runs on a thread kept on that thread's CPU, and a
longer one is let go to any CPU; the placement is read back from the kernel inside
the step (``os.sched_getaffinity``), not taken from the pool's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import step_threads

_PLACES = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1
needs_cpus = pytest.mark.skipif(
    not _PLACES, reason="placing a thread needs Linux and more than one CPU to choose from"
)


def _cpus() -> set[int]:
    return set(os.sched_getaffinity(0))


def test_a_result_an_error_and_the_arguments_come_back() -> None:
    pool = step_threads.StepThreads(2)
    try:
        assert pool.submit(lambda a, b: a + b, 2, 3).result(5) == 5
        failing = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(5)
        stopping = pool.submit(lambda: (_ for _ in ()).throw(KeyboardInterrupt))
        assert isinstance(stopping.exception(5), KeyboardInterrupt)  # not lost in the thread
    finally:
        pool.shutdown()


def test_one_step_after_another_reuses_one_thread() -> None:
    pool = step_threads.StepThreads(8)
    try:
        names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(50)}
        assert names == {"durably-step_0"}
        assert len(pool.threads()) == 1
    finally:
        pool.shutdown()


def test_no_more_threads_than_its_size_and_the_rest_wait_in_turn() -> None:
    pool = step_threads.StepThreads(3)
    gate = threading.Event()
    running: list[int] = []
    lock = threading.Lock()
    most = [0]

    def step(i: int) -> int:
        with lock:
            running.append(i)
            most[0] = max(most[0], len(running))
        gate.wait(5)
        with lock:
            running.remove(i)
        return i

    try:
        futures = [pool.submit(step, i) for i in range(10)]
        deadline = time.monotonic() + 5
        while len(running) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.02)  # a fourth thread, had one been made, would be running by now
        assert len(pool.threads()) == 3
        assert sorted(running) == [0, 1, 2]  # the others wait, in the order given
        gate.set()
        assert [f.result(5) for f in futures] == list(range(10))
        assert most[0] == 3
    finally:
        gate.set()
        pool.shutdown()


def test_a_cancelled_step_that_had_not_begun_is_not_run() -> None:
    pool = step_threads.StepThreads(1)
    gate = threading.Event()
    ran: list[str] = []
    try:
        busy = pool.submit(gate.wait, 5)
        waiting = pool.submit(lambda: ran.append("waiting"))
        assert waiting.cancel()
        gate.set()
        busy.result(5)
        assert pool.submit(lambda: "after").result(5) == "after"
        assert ran == []
    finally:
        gate.set()
        pool.shutdown()


def test_shutdown_ends_idle_threads_finishes_the_running_step_and_takes_no_more() -> None:
    pool = step_threads.StepThreads(4)
    gate = threading.Event()
    idle = pool.submit(lambda: "idle")
    idle.result(5)
    busy = pool.submit(gate.wait, 5)
    queued = [pool.submit(lambda i=i: i) for i in range(3)]
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
    gate.set()
    assert busy.result(5) is True
    assert [f.result(5) for f in queued] == [0, 1, 2]  # taken before the shutdown: run
    deadline = time.monotonic() + 5
    while pool.threads() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.threads() == []


@needs_cpus
def test_a_step_waited_for_runs_on_the_callers_cpu_and_one_let_go_on_any() -> None:
    home = _cpus()
    pool = step_threads.StepThreads(2)
    release = threading.Event()
    try:
        for _ in range(20):  # the caller may move between CPUs: each time, the step follows
            placed = pool.submit(_cpus, near=True).result(5)
            assert len(placed) == 1 and placed <= home

        def long_step() -> tuple[set[int], set[int]]:
            before = _cpus()
            release.wait(5)
            return before, _cpus()

        future = pool.submit(long_step, near=True)
        time.sleep(0.01)
        pool.let_go(future)  # as the loop's thread does when the wait runs out
        release.set()
        before, after = future.result(5)
        assert len(before) == 1
        assert after == home
        # a step not waited for runs anywhere, on the thread just kept on one CPU too
        assert pool.submit(_cpus).result(5) == home
    finally:
        release.set()
        pool.shutdown()


@needs_cpus
def test_a_system_that_refuses_to_place_threads_leaves_them_where_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(pid: int, cpus: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)  # the OS refuses (a sandbox)
    pool = step_threads.StepThreads(1)
    try:
        assert [pool.submit(_cpus, near=True).result(5) for _ in range(3)] == [_cpus()] * 3
    finally:
        pool.shutdown()


@durably.step
def where_it_runs(hold: float) -> dict[str, Any]:
    before = sorted(os.sched_getaffinity(0))
    time.sleep(hold)
    return {
        "thread": threading.current_thread().name,
        "before": before,
        "after": sorted(os.sched_getaffinity(0)),
    }


@durably.workflow
async def placed_steps() -> list[dict[str, Any]]:
    quick = [await where_it_runs(0.0) for _ in range(5)]
    slow = await where_it_runs(0.05)  # longer than the loop's thread waits for it
    both = await asyncio.gather(where_it_runs(0.02), where_it_runs(0.02))
    return [*quick, slow, *both]


@needs_cpus
async def test_an_engines_quick_sync_step_runs_on_the_loops_cpu_and_a_long_one_anywhere(
    tmp_path: Path,
) -> None:
    home = sorted(_cpus())
    async with durably.Engine(f"sqlite:///{tmp_path}/placed.db") as engine:
        handle = await engine.start(placed_steps)
        *quick, slow, a, b = await handle.result()
    for step in quick:
        assert step["thread"].startswith("durably-step")
        assert len(step["before"]) == 1 and set(step["before"]) <= set(home)
    assert len(slow["before"]) == 1  # waited for at first,
    assert slow["after"] == home  # then let go when the wait ran out
    # two at once: the loop was not quiet when the second began, so it was never kept
    assert a["thread"] != b["thread"]
    assert home in (a["before"], b["before"])


@durably.step
def add_on_a_thread(a: int, b: int) -> int:
    return a + b


@durably.workflow
async def many_sync_steps(n: int) -> int:
    total = 0
    for i in range(n):
        total = await add_on_a_thread(total, i)
    return total


async def test_sync_steps_of_many_workflows_at_once_all_commit(tmp_path: Path) -> None:
    async with durably.Engine(f"sqlite:///{tmp_path}/many.db", step_threads=4) as engine:
        handles = [await engine.start(many_sync_steps, 20) for _ in range(30)]
        results = await asyncio.gather(*(h.result() for h in handles))
        assert results == [sum(range(20))] * 30
        assert len(engine._step_threads.threads()) <= 4  # a test of the bound: its own pool
        for h in handles[:3]:
            steps = [e for e in await engine.history(h.workflow_id) if e.kind == "step"]
            assert len(steps) == 20 and all(e.status == "completed" for e in steps)


def test_futures_are_concurrent_futures() -> None:
    """What asyncio.wrap_future and the hold's wait take."""
    pool = step_threads.StepThreads(1)
    try:
        future = pool.submit(lambda: 7)
        assert isinstance(future, concurrent.futures.Future)
        assert asyncio.run(_wrapped(future)) == 7
    finally:
        pool.shutdown()


async def _wrapped(future: concurrent.futures.Future[int]) -> int:
    return await asyncio.wrap_future(future)
