"""The engine's lifecycle: close() always returns, a drain keeps its leases, a blocked loop.

The close tests run in one process; the drain and blocked-loop tests run real
``durably worker`` processes (tests/multiworker.py) on SQLite and PostgreSQL,
send them SIGTERM, and count what ran in the effects file the steps append to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pytest

import durably

# --- close() returns whatever wakes the engine meanwhile --------------------------------------


class _WakeOnCancel(asyncio.Task):  # type: ignore[type-arg]
    """A task that, asked to cancel, first sets off the engine's wake-up in the same call.

    This is the race of CPython gh-86296 made certain: a wake-up (a last NOTIFY, a timer)
    lands in the same loop iteration as the cancellation of a loop waiting for it.
    """

    engine: durably.Engine | None = None

    def cancel(self, msg: Any = None) -> bool:
        if self.engine is not None and self.get_name().startswith("durably-"):
            self.engine._kick_recovery()
        return super().cancel(msg)


async def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


@pytest.mark.timeout(60)
async def test_close_returns_when_a_wake_up_lands_with_its_cancel(sqlite_url: str) -> None:
    loop = asyncio.get_running_loop()

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        return _WakeOnCancel(coro, loop=loop, **kw)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        engine = durably.Engine(sqlite_url, poll_interval=30.0, lease_seconds=30.0)
        _WakeOnCancel.engine = engine
        await engine.open()
        await _until(lambda: bool(engine._kick._waiters), "the recovery loop to wait")  # type: ignore[union-attr]
        started = time.monotonic()
        async with asyncio.timeout(20):
            await engine.close()
        assert time.monotonic() - started < 10
    finally:
        _WakeOnCancel.engine = None
        loop.set_task_factory(None)


STUBBORN: dict[str, Any] = {}


@durably.step
async def stubborn() -> str:
    """A step that swallows its cancellations until the test lets it go."""
    STUBBORN["started"].set()
    while not STUBBORN["release"].is_set():
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            STUBBORN["cancels"] += 1
    STUBBORN["left"].set()
    return "done"


@durably.workflow(name="test_lifecycle.stubborn")
async def stubborn_flow() -> str:
    return await stubborn()


@pytest.mark.timeout(60)
async def test_close_gives_up_on_a_run_that_ignores_cancellation_and_names_it(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durably.engine, "STOP_GRACE", 1.0)
    STUBBORN.update(
        started=asyncio.Event(), release=asyncio.Event(), left=asyncio.Event(), cancels=0
    )
    engine = durably.Engine(sqlite_url, lease_seconds=5.0)
    await engine.open()
    await engine.start(stubborn_flow, workflow_id="stubborn")
    await asyncio.wait_for(STUBBORN["started"].wait(), 10)
    task = engine._tasks["stubborn"]
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="durably"):
        async with asyncio.timeout(20):
            await engine.close(drain_timeout=0.3)
    took = time.monotonic() - started
    assert took < 0.3 + 1.0 + 2.0, took
    assert STUBBORN["cancels"] >= 1 and not task.done()
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert len(gave_up) == 1 and "durably:stubborn" in gave_up[0], gave_up
    STUBBORN["release"].set()  # let it end: it then waits for the closed store; cancel that
    await asyncio.wait_for(STUBBORN["left"].wait(), 10)
    task.cancel()
    await asyncio.wait({task}, timeout=10)
    assert task.done()
