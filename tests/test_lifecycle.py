"""The engine's lifecycle: close() always returns, a drain keeps its leases, a blocked loop.

The close tests run in one process; the drain and blocked-loop tests run real
``durably worker`` processes (tests/multiworker.py) on SQLite and PostgreSQL,
send them SIGTERM, and count what ran in the effects file the steps append to.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import operations
from tests import lifecycle_flows as life
from tests import multiworker

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


async def test_a_cancellation_that_lands_with_the_wake_up_is_not_lost() -> None:
    """The wait of the recovery loop, the heartbeat and result(): cancelled means cancelled."""
    event = asyncio.Event()
    waiter = asyncio.create_task(operations.wait_event(event, 30.0))
    await _until(lambda: bool(event._waiters), "the waiter to wait")  # type: ignore[attr-defined]
    event.set()
    waiter.cancel()  # in the same iteration as the wake-up
    done, _ = await asyncio.wait({waiter}, timeout=5)
    assert done and waiter.cancelled()


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


# --- a run that let go while another drains ------------------------------------------------

DRAIN: dict[str, threading.Event] = collections.defaultdict(threading.Event)


@durably.step
def drain_hold(which: str) -> str:
    """A plain step that runs until the test lets ``which`` go."""
    DRAIN[f"{which}-started"].set()
    DRAIN[f"{which}-go"].wait(20)
    return which


@durably.workflow(name="test_lifecycle.drained")
async def drained(which: str) -> str:
    await drain_hold(which)
    return await drain_hold(f"{which}-again")


@pytest.mark.timeout(60)
async def test_a_run_that_let_go_while_another_drains_is_not_released_as_a_crash(
    sqlite_url: str,
) -> None:
    """close() lets a run end its step and suspend at the next while another step still
    drains; the heartbeats meanwhile must not take the suspended one, held and driven by
    no run, for an orphan and count a crash: close() releases it cleanly."""
    DRAIN.clear()
    engine = durably.Engine(sqlite_url, lease_seconds=0.6)  # a heartbeat every 0.2 s
    await engine.open()
    for which in ("slow", "quick"):
        await engine.start(drained, which, workflow_id=which)
        assert await asyncio.to_thread(DRAIN[f"{which}-started"].wait, 10)
    assert engine._services is not None
    stopping = engine._services.stopping
    closing = asyncio.create_task(engine.close(drain_timeout=30))
    try:
        await _until(stopping.is_set, "close() to begin")
        DRAIN["quick-go"].set()  # it commits its step and suspends at the next
        await _until(lambda: "quick" not in engine._tasks, "the quick run to suspend")
        renewals: set[float | None] = set()
        while len(renewals) < 4:  # three heartbeats since (each renews the slow one's lease)
            renewals.add((await engine.get_workflow("slow")).lease_expires_at)
            await asyncio.sleep(0.02)
        quick = await engine.get_workflow("quick")
        assert (quick.owner, quick.crash_count) == (engine.executor_id, 0)
    finally:
        DRAIN["slow-go"].set()
        await asyncio.wait_for(closing, 30)
    with durably.Client(sqlite_url) as client:
        quick = client.get_workflow("quick")
    assert (quick.status, quick.owner, quick.crash_count) == ("running", None, 0)


# --- a start whose caller is cancelled ---------------------------------------------------

STARTED: list[str] = []


@durably.step
async def note_start(what: str) -> str:
    STARTED.append(what)
    return what


@durably.workflow(name="test_lifecycle.noted")
async def noted(what: str) -> str:
    return await note_start(what)


def _exists(client: durably.Client, workflow_id: str) -> bool:
    try:
        client.get_workflow(workflow_id)
    except durably.WorkflowNotFound:
        return False
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["queued", "committed"])
async def test_a_start_cancelled_after_it_was_sent_still_runs_here_at_once(
    store_url: str, when: str
) -> None:
    """A start whose caller is cancelled once the commit is on its way runs here at once,
    not left owned by this engine and idle until its lease runs out (a crash).

    ``queued``: cancelled while the commit waits on the store thread. ``committed``: the
    loop is held until the row is in the database, then the caller is cancelled before
    it has seen the answer.
    """
    STARTED.clear()
    wid = f"cancelled-start-{when}"
    async with durably.Engine(store_url, inline_commits=False, lease_seconds=60) as engine:
        starting = asyncio.create_task(engine.start(noted, when, workflow_id=wid))
        await asyncio.sleep(0)  # the commit is on the store thread now
        if when == "committed":
            with durably.Client(store_url) as client:  # the loop stays held meanwhile
                deadline = time.monotonic() + 10
                while not _exists(client, wid):
                    assert time.monotonic() < deadline, "the start never committed"
                    time.sleep(0.005)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        handle = engine.handle(wid)
        assert await handle.result(timeout=10) == when  # well inside the 60 s lease
        info = await handle.info()
    assert info.crash_count == 0
    assert len(STARTED) == 1 and STARTED[0] == when


# --- a blocked event loop, in one process --------------------------------------------------


@durably.step
async def nap(seconds: float) -> str:
    time.sleep(seconds)  # blocks the event loop, as a blocking SDK call in an async step would
    return "rested"


@durably.workflow(name="test_lifecycle.napper")
async def napper(seconds: float) -> str:
    return await nap(seconds)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The warnings about the nap step (a loaded machine may add others, about its lag)."""
    return [
        r
        for r in caplog.records
        if "blocked the event loop" in r.getMessage() and "'nap'" in r.getMessage()
    ]


@pytest.mark.timeout(60)
async def test_a_blocked_loop_keeps_its_lease_and_the_step_is_named_once(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async step blocks the loop for three leases: the lease stays ahead all along."""
    lease, block = 1.2, 4.0
    samples: list[tuple[float, float | None, str | None]] = []
    done = threading.Event()

    def watch() -> None:  # another thread reads the row while the loop is blocked
        with durably.Client(store_url) as client:
            while not done.is_set():
                info = client.get_workflow("napper")
                samples.append((time.time(), info.lease_expires_at, info.status))
                time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="durably"):
        async with durably.Engine(store_url, lease_seconds=lease) as engine:
            handle = await engine.start(napper, block, workflow_id="napper")
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                assert await handle.result(timeout=30) == "rested"
            finally:
                done.set()
                watcher.join(10)
            claims = await engine.claims("napper")
            deadline = time.monotonic() + 10  # the warning comes when the loop ticks again
            while time.monotonic() < deadline and not _warnings(caplog):
                await asyncio.sleep(0.05)
    running = [(t, expires) for t, expires, status in samples if status == "running"]
    assert len(running) > block / 0.05 / 2, samples  # it did sample the whole block
    late = [(t, expires) for t, expires in running if expires is None or expires <= t]
    assert late == [], late
    assert len(claims) == 1, claims
    warned = _warnings(caplog)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    message = warned[0].getMessage()
    assert warned[0].levelno == logging.WARNING
    assert "async step 'nap' (workflow 'napper', seq 1" in message, message
    seconds = float(message.split(" blocked the event loop for ")[1].split(" s")[0])
    assert block - 0.5 <= seconds <= block + 1.0, message
    assert "def" in message


# --- real worker processes: a drain and a blocked loop keep their leases ---------------------


class _Pool(multiworker.Pool):
    """Workers serving tests/lifecycle_flows.py."""

    def argv(self) -> list[str]:
        return [
            "tests.lifecycle_flows" if arg == "tests.multiworker_flows" else arg
            for arg in super().argv()
        ]


@pytest.mark.slow
def test_a_draining_worker_keeps_its_lease_until_its_step_has_committed(
    store_url: str, tmp_path: Path
) -> None:
    """SIGTERM to the worker inside a step three leases long: nobody else starts that step."""
    workers = _Pool(store_url, tmp_path, "", lease=2.0, poll=0.3)
    try:
        workers.start(2)
        with durably.Client(store_url) as client:
            client.start(life.drain_flow, 6.0, workflow_id="drain")

            def started() -> list[dict[str, Any]]:
                return [e for e in workers.effects_lines() if e["step"] == "slow-start"]

            workers.wait_for(lambda: bool(started()), "a worker to start the slow step")
            (a,) = [w for w in workers.workers if w.pid == started()[0]["pid"]]
            workers.kill(a, signal.SIGTERM)
            assert a.proc.wait(30) == 0, workers.describe()
            workers.wait_for(lambda: client.get_workflow("drain").finished, "the end", 30)
            info = client.get_workflow("drain")
            history = client.history("drain")
        effects = workers.effects_lines()
    finally:
        workers.stop()
    assert (info.status, info.output) == ("completed", '["slow","after"]'), info
    assert _count(effects) == {"slow-start": 1, "slow-end": 1, "after": 1}, effects
    (slow_end,) = [e for e in effects if e["step"] == "slow-end"]
    assert slow_end["pid"] == a.pid  # the draining worker finished it, and its receipt counted
    assert [(e.name, e.status, e.attempt) for e in history] == [
        ("slow_sync", "completed", 1),
        ("after", "completed", 1),
    ]


def _count(effects: list[dict[str, Any]]) -> dict[str, int]:
    return dict(collections.Counter(e["step"] for e in effects))


@pytest.mark.slow
def test_an_async_step_that_blocks_the_loop_keeps_its_lease_and_is_named(
    store_url: str, tmp_path: Path
) -> None:
    """An async step that time.sleep()s three and a half leases: it starts once, one claim."""
    workers = _Pool(store_url, tmp_path, "", lease=2.0, poll=0.3)
    try:
        workers.start(2)
        with durably.Client(store_url) as client:
            client.start(life.blocked_flow, 7.0, workflow_id="blocked")
            workers.wait_for(lambda: client.get_workflow("blocked").finished, "the end", 40)
            info = client.get_workflow("blocked")
            claims = client.claims("blocked")
        effects = workers.effects_lines()
        (start,) = [e for e in effects if e["step"] == "block-start"]
        (blocker,) = [w for w in workers.workers if w.pid == start["pid"]]

        def warned() -> list[str]:
            lines = blocker.output().splitlines()
            return [ln for ln in lines if "blocked the event loop" in ln and "'blocking'" in ln]

        workers.wait_for(lambda: bool(warned()), "the warning about the blocked loop", 10)
    finally:
        workers.stop()
    assert (info.status, info.output) == ("completed", '["blocked","after"]'), info
    assert _count(effects) == {"block-start": 1, "block-end": 1, "after": 1}, effects
    assert len(claims) == 1, claims
    assert len(warned()) == 1 and "async step 'blocking'" in warned()[0], blocker.output()


@durably.step
async def idle_step() -> str:
    await asyncio.sleep(60)
    return "idle"


@durably.workflow(name="test_lifecycle.idler")
async def idler() -> str:
    return await idle_step()


@pytest.mark.timeout(60)
def test_a_loop_that_stopped_running_is_not_kept_alive_by_the_watchdog(sqlite_url: str) -> None:
    """An event loop that is not running (not blocked) keeps no lease: nothing runs there."""
    loop = asyncio.new_event_loop()
    engine = durably.Engine(sqlite_url, lease_seconds=0.6)
    try:
        loop.run_until_complete(engine.open())
        loop.run_until_complete(engine.start(idler, workflow_id="idler"))
        loop.run_until_complete(asyncio.sleep(0.3))  # its step is running
        with durably.Client(sqlite_url) as client:
            assert client.get_workflow("idler").status == "running"
            deadline = time.monotonic() + 10
            while (client.get_workflow("idler").lease_expires_at or 0) > time.time():
                assert time.monotonic() < deadline, "the lease of a stopped loop was kept"
                time.sleep(0.05)
    finally:
        loop.run_until_complete(engine.close(drain_timeout=0.1))
        loop.close()
