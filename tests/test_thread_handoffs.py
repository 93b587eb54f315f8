"""Hand-offs between the event loop's thread, the store threads and the step threads,
at their edges: a caller that goes while its op waits to run again after a conflict,
and an engine opened again after it closed.

Real SQLite files and real threads throughout; an op that raises ``TransactionConflict``
itself stands for one PostgreSQL undid to end a deadlock, as in ``test_store``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import durably
from durably import errors
from durably.storage import create_store, thread


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[thread.StoreThread]:
    runner = thread.StoreThread(create_store(f"sqlite:///{tmp_path / 'h.db'}"))
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


async def test_an_op_whose_caller_went_during_the_pause_after_a_conflict_is_not_run_again(
    runner: thread.StoreThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store thread pauses before it runs an undone op again; a caller cancelled
    during that pause has gone, and nothing of its op was written: it is not run."""
    pausing, resume = threading.Event(), threading.Event()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread().name.startswith("durably-store"):
            pausing.set()  # the pause after a conflict: held until the caller has gone
            assert resume.wait(5)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(thread.time, "sleep", sleep)
    runs: list[str] = []

    def undone() -> None:
        runs.append(threading.current_thread().name)
        raise errors.TransactionConflict("deadlock detected (in this test)")

    loop = asyncio.get_running_loop()
    caller = asyncio.create_task(runner.call(undone))
    assert await loop.run_in_executor(None, pausing.wait, 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    resume.set()
    assert await runner.call(int) == 0  # queued behind it: the store thread is past it
    assert runs == ["durably-store"]  # once, before the conflict; not after its caller went


@durably.step
def add(a: int, b: int) -> int:
    return a + b


@durably.workflow
async def adds(a: int, b: int) -> int:
    return await add(a, b)


async def test_an_engine_opened_again_after_close_runs_its_sync_steps(tmp_path: Path) -> None:
    """close() shuts the step threads down; an engine opened again runs its plain ``def``
    steps on threads of its own, instead of journaling each as failed with the refusal of
    a pool that was shut down."""
    engine = durably.Engine(f"sqlite:///{tmp_path / 'again.db'}")
    async with engine:
        first = await engine.start(adds, 1, 2)
        assert await first.result(timeout=10) == 3
    async with engine:
        second = await engine.start(adds, 3, 4)
        assert await second.result(timeout=10) == 7
