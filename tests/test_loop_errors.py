"""The engine's long-lived loops live through an error nobody expected.

The heartbeat, the recovery loop (claims, timers, wake-ups), the retention loop and
PostgreSQL's LISTEN thread each expected only the store's errors (``StoreError``,
``psycopg.Error``). Anything else -- an ``OSError`` or ``ValueError`` from a driver,
a bug -- ended the loop for good while the engine looked alive: its leases lapsed, it
claimed no more work, it pruned nothing, a signal waited for the poll. Each test here
makes one method of the real store (or the listener's ``use_schema``) raise once, then
behave as it does, and checks the loop's work goes on; and that the error is logged
with its traceback once.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import durably
from durably.storage import pg_listener

HOLD = threading.Event()


@durably.step
def le_hold() -> str:
    """A step that runs until the test lets it go (its workflow holds a lease meanwhile)."""
    HOLD.wait(20)
    return "held"


@durably.workflow(name="loop-errors.held")
async def held() -> str:
    return await le_hold()


@durably.step
async def le_echo(text: str) -> str:
    return text


@durably.workflow(name="loop-errors.echo")
async def echo(text: str) -> str:
    return await le_echo(text)


@durably.workflow(name="loop-errors.waiter")
async def waiter() -> Any:
    return await durably.wait_for_signal("go")


def fail_once(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str, error: Exception, times: int = 1
) -> threading.Event:
    """Make ``target.name`` (a method of the real store) raise ``error`` the first ``times``
    it is called from now on, and run as it does after; the event is set once it raised.

    (The store thread runs a batch's ops again one by one when one fails: an op that
    shared its batch is called twice for one call of its caller.)"""
    real = getattr(target, name)
    raised = threading.Event()
    left = [times]

    @functools.wraps(real)
    def once(*args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            raised.set()
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, once)
    return raised


async def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def logged_once(caplog: pytest.LogCaptureFixture, text: str) -> None:
    """One error record naming ``text``, with its traceback."""
    found = [r for r in caplog.records if text in r.getMessage() and r.exc_info]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.timeout(60)
async def test_the_heartbeat_goes_on_after_an_unexpected_error(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A heartbeat that raised OSError still beats: the executor's heartbeat_at and the
    lease of the workflow it runs keep moving, so no other executor takes it over."""
    HOLD.clear()
    caplog.set_level(logging.INFO, logger="durably")
    async with durably.Engine(store_url, lease_seconds=0.6, poll_interval=30) as engine:
        try:
            await engine.start(held, workflow_id="le-held")
            raised = fail_once(
                monkeypatch, engine._store.store, "heartbeat", OSError(5, "I/O error"), times=2
            )
            await until(raised.is_set, "the heartbeat to fail")
            with durably.Client(store_url) as client:

                def beat_at() -> float:
                    (me,) = [e for e in client.executors() if e.executor_id == engine.executor_id]
                    return me.heartbeat_at

                at_fault = await asyncio.to_thread(beat_at)
                await asyncio.sleep(1.2)  # two leases: six beats
                assert await asyncio.to_thread(beat_at) > at_fault, "heartbeat_at stopped"
                info = await asyncio.to_thread(client.get_workflow, "le-held")
                assert info.owner == engine.executor_id
                assert info.lease_expires_at is not None
                assert info.lease_expires_at > time.time(), "the lease lapsed"
        finally:
            HOLD.set()
    logged_once(caplog, "heartbeat")


@pytest.mark.timeout(60)
async def test_the_recovery_loop_goes_on_after_an_unexpected_error(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim that raised ValueError in the recovery loop: a workflow submitted after it
    (by a client, so only a claim runs it) is still claimed and run."""
    caplog.set_level(logging.INFO, logger="durably")
    async with durably.Engine(store_url, poll_interval=0.05) as engine:
        raised = fail_once(
            monkeypatch,
            engine._store.store,
            "claim_next",
            ValueError("a driver's surprise"),
            times=2,
        )
        await until(raised.is_set, "the claim to fail")
        with durably.Client(store_url) as client:
            wid = await asyncio.to_thread(client.start, echo, "after", workflow_id="le-after")
        assert await engine.handle(wid).result(timeout=10) == "after"
    logged_once(caplog, "recovery")


@pytest.mark.timeout(60)
async def test_the_retention_loop_goes_on_after_an_unexpected_error(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A prune that raised OSError: workflows finished after it are still pruned."""
    caplog.set_level(logging.INFO, logger="durably")
    keep = datetime.timedelta(milliseconds=100)
    engine = durably.Engine(sqlite_url, retention=keep)
    # (the loop is handed the verb when the engine opens)
    raised = fail_once(monkeypatch, engine._store.store, "prune", OSError(28, "No space"), times=2)
    async with engine:
        await until(raised.is_set, "the prune to fail")
        handle = await engine.start(echo, "old", workflow_id="le-pruned")
        assert await handle.result(timeout=10) == "old"
        with durably.Client(sqlite_url) as client:

            def gone() -> bool:
                return not [w for w in client.list_workflows() if w.workflow_id == "le-pruned"]

            await until(gone, "the finished workflow to be pruned")
    logged_once(caplog, "retention")


@pytest.mark.timeout(60)
async def test_the_listener_goes_on_after_an_unexpected_error(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The LISTEN thread met an OSError that is not psycopg's: it listens again, and a
    signal sent from elsewhere to a parked workflow wakes it at once, not at the poll."""
    caplog.set_level(logging.INFO, logger="durably")
    wid = "le-waiter"
    raised = threading.Event()
    real_use_schema = pg_listener.use_schema

    def use_schema(conn: Any, schema: str) -> None:
        if threading.current_thread().name == "durably-listen" and not raised.is_set():
            raised.set()
            raise OSError(9, "Bad file descriptor")
        real_use_schema(conn, schema)

    monkeypatch.setattr(pg_listener, "use_schema", use_schema)
    async with durably.Engine(postgres_url, hold_seconds=0.0, poll_interval=30) as engine:
        await until(raised.is_set, "the listener to fail")
        handle = await engine.start(waiter, workflow_id=wid)
        while await handle.status() != "waiting" or wid in engine._tasks:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the listener's back-off, once
        with durably.Client(postgres_url) as client:
            assert await asyncio.to_thread(client.send_signal, wid, "go", "hi")
        assert await handle.result(timeout=5) == "hi"
    logged_once(caplog, "wake-up")


@pytest.mark.timeout(60)
async def test_a_loop_that_fails_every_turn_backs_off_logs_once_and_stops_promptly(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that fails every pass: the recovery loop waits a growing back-off instead of
    spinning at its 10 ms poll, logs the traceback once, and close() still ends it at once
    (and the retention loop too, which waits on the engine's stop)."""
    caplog.set_level(logging.INFO, logger="durably")
    engine = durably.Engine(sqlite_url, poll_interval=0.01, retention=datetime.timedelta(hours=1))
    await engine.open()
    try:
        calls = [0]
        store = engine._store.store
        real = store.claim_next

        @functools.wraps(real)
        def broken(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            raise TypeError("a bug")

        monkeypatch.setattr(store, "claim_next", broken)
        await asyncio.sleep(1.5)
        # 50 ms, 100, 200, 400, 800: about six passes, where the poll alone makes 150
        assert 2 <= calls[0] <= 12, calls
    finally:
        started = time.monotonic()
        await engine.close()
    assert time.monotonic() - started < 1.0
    logged_once(caplog, "recovery loop")
