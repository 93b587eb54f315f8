"""Wake-ups that arrive at an awkward moment of a run: between a signal wait's look at the
store and its block, while its park is on its way, or once it parked and is letting go. The
run must not lose them: a wake-up that finds no wait to poke would otherwise be seen only
by the next park or poll."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

import durably
from durably import messages
from durably.storage import pg_listener

#: Set by the workflow once its signal wait returned (while its step still runs).
GOT = threading.Event()
#: Lets the long step end.
RELEASE = threading.Event()


@durably.step
def long_step() -> str:
    RELEASE.wait(15)
    return "step done"


@durably.workflow(name="wake-races.busy-waiter")
async def busy_waiter() -> list[Any]:
    async def wait() -> Any:
        got = await durably.wait_for_signal("go")
        GOT.set()
        return got

    return list(await asyncio.gather(wait(), long_step()))


def after_verb(engine: durably.Engine, verb: str, then: Callable[[], Any]) -> None:
    """Run ``then`` (a coroutine function) the first time ``verb`` returns to the run, after
    its commit and before the run sees the answer; the store runs as it is."""
    store_thread: Any = engine._store
    real_call = store_thread.call
    done: list[bool] = []

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = await real_call(fn, *args, **kwargs)
        if getattr(fn, "__name__", "") == verb and not done:
            done.append(True)
            await then()
        return result

    store_thread.call = call


async def test_a_signal_sent_between_a_waits_look_and_its_block_wakes_it(store_url: str) -> None:
    """The signal is committed, and the run poked, after ``receive_signal`` found nothing and
    before the wait blocks; a step of the run still runs, so no park looks again."""
    GOT.clear()
    RELEASE.clear()
    wid = "wake-races-look-then-block"
    async with durably.Engine(store_url, poll_interval=30) as engine:

        async def send() -> None:
            assert await engine.send_signal(wid, "go", "hi")

        after_verb(engine, "receive_signal", send)
        try:
            handle = await engine.start(busy_waiter, workflow_id=wid)
            received = await asyncio.to_thread(GOT.wait, 5)
            assert received, "the wait did not see the signal while the step ran"
        finally:
            RELEASE.set()
        assert await handle.result(timeout=10) == ["hi", "step done"]


@durably.workflow(name="wake-races.waiter")
async def waiter() -> Any:
    return await durably.wait_for_signal("go")


async def test_a_signal_sent_while_the_park_is_on_its_way_wakes_the_parked_run(
    store_url: str,
) -> None:
    """The signal is committed after the park, and its wake-up pokes the run before the run
    learns that it parked: the poke finds a wait that is about to be suspended, so the engine
    must look for the workflow (now claimable) itself, not at its next poll."""
    wid = "wake-races-park-then-signal"
    async with durably.Engine(store_url, hold_seconds=0.0, poll_interval=30) as engine:

        async def send() -> None:
            assert await engine.send_signal(wid, "go", "hi")

        after_verb(engine, "park", send)
        handle = await engine.start(waiter, workflow_id=wid)
        assert await handle.result(timeout=5) == "hi"


async def test_a_signal_sent_before_the_first_listen_took_hold_is_found(
    postgres_url: str, monkeypatch: Any
) -> None:
    """An engine opens, its recovery pass finds nothing due, and a signal is sent elsewhere
    before its listener's first LISTEN took hold: that NOTIFY reached no one, so the listener
    must report ``work`` once listening, as after a reconnect, not leave it to the poll."""
    wid = "wake-races-before-listen"
    async with durably.Engine(postgres_url, hold_seconds=0.0) as first:
        handle = await first.start(waiter, workflow_id=wid)
        while await handle.status() != "waiting" or wid in first._tasks:
            await asyncio.sleep(0.01)
    connected, listen = threading.Event(), threading.Event()
    real_use_schema = pg_listener.use_schema

    def use_schema(conn: Any, schema: str) -> None:
        if threading.current_thread().name == "durably-listen":  # not the store's connections
            connected.set()
            listen.wait(10)  # the LISTEN waits for the test's signal
        real_use_schema(conn, schema)

    monkeypatch.setattr(pg_listener, "use_schema", use_schema)
    async with durably.Engine(postgres_url, poll_interval=30) as engine:
        assert await asyncio.to_thread(connected.wait, 5)
        with durably.Client(postgres_url) as client:
            assert await asyncio.to_thread(client.send_signal, wid, "go", "hi")
        listen.set()
        assert await engine.handle(wid).result(timeout=5) == "hi"


async def test_a_listener_whose_socket_is_past_fd_1024_still_hears_signals(
    postgres_url: str,
) -> None:
    """In a process with a thousand files open, the listener's connection (and its stop
    pipe) get descriptors past 1024, which ``select.select`` refuses (ValueError): the
    wake-up then waited for the poll, 30 s here. It waits with a selector now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held: list[int] = []
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        while not held or held[-1] < 1040:  # the lowest free descriptors, all taken
            held.append(os.dup(null))
        async with durably.Engine(postgres_url, poll_interval=30) as engine:
            handle = await engine.start(waiter, workflow_id="wake-races-past-1024")
            for _ in range(250):
                if (await handle.info()).status == "waiting":
                    break
                await asyncio.sleep(0.02)
            async with durably.Engine(postgres_url, poll_interval=30) as sender:
                assert await sender.send_signal("wake-races-past-1024", "go", "hi")
            assert await handle.result(timeout=5) == "hi"
    finally:
        for fd in [*held, null]:
            os.close(fd)


# --- a wake-up for a parent that parked and has not let go yet -------------------------

#: Set by the parent's first run once its join parked; and what lets that run go on.
PARKED: list[asyncio.Event] = []
LET_GO: list[asyncio.Event] = []


@durably.workflow(name="wake-races.kid")
async def kid() -> str:
    await durably.wait_for_signal("go")
    return "kid"


@durably.workflow(name="wake-races.slow-to-let-go")
async def slow_to_let_go() -> str:
    handle = await durably.start_child(kid, workflow_id="wake-races-kid")
    try:
        return "parent saw " + await handle.result()
    except BaseException:  # the park's Suspended: async clean-up (closing a client, say)
        if not PARKED[0].is_set():  # the first run only
            PARKED[0].set()
            await asyncio.wait_for(LET_GO[0].wait(), 15)
        raise


async def test_a_child_that_ends_while_its_parent_lets_go_wakes_the_parent(
    store_url: str,
) -> None:
    """The parent's join parked, and its run is still letting go (its code's clean-up runs)
    when the child ends here: the child's end pokes the parent's run, which has no wait left
    to poke. The parked parent (due now) must be taken at once, not at the next poll (30 s
    here)."""
    PARKED[:], LET_GO[:] = [asyncio.Event()], [asyncio.Event()]
    async with durably.Engine(store_url, hold_seconds=0.0, poll_interval=30) as engine:
        handle = await engine.start(slow_to_let_go, workflow_id="wake-races-parent")
        await asyncio.wait_for(PARKED[0].wait(), 10)
        assert (await handle.info()).status == "waiting"
        assert engine._runs["wake-races-parent"].parked  # parked, and not let go yet
        assert await engine.send_signal("wake-races-kid", "go")
        assert await engine.handle("wake-races-kid").result(timeout=10) == "kid"
        while "wake-races-kid" in engine._tasks:  # its run has ended, and poked the parent
            await asyncio.sleep(0.01)
        LET_GO[0].set()
        assert await handle.result(timeout=5) == "parent saw kid"


@durably.workflow(name="wake-races.slow-waiter")
async def slow_waiter() -> Any:
    try:
        return await durably.wait_for_signal("go")
    except BaseException:  # the park's Suspended, as above
        if not PARKED[0].is_set():
            PARKED[0].set()
            await asyncio.wait_for(LET_GO[0].wait(), 15)
        raise


async def test_a_signal_sent_while_the_run_lets_go_of_its_park_wakes_it(
    store_url: str,
) -> None:
    """The same window for a signal: sent while the parked run is still letting go, it is
    committed alone (the run is still here, so it cannot be taken in the same commit) and
    the engine looks for the workflow itself (this one passed before the fix: the signal's
    wake-up finds the run not listening and asks for a pass)."""
    PARKED[:], LET_GO[:] = [asyncio.Event()], [asyncio.Event()]
    wid = "wake-races-slow-waiter"
    async with durably.Engine(store_url, hold_seconds=0.0, poll_interval=30) as engine:
        handle = await engine.start(slow_waiter, workflow_id=wid)
        await asyncio.wait_for(PARKED[0].wait(), 10)
        assert engine._runs[wid].parked  # parked, and not let go yet
        assert await engine.send_signal(wid, "go", "hi")
        LET_GO[0].set()
        assert await handle.result(timeout=5) == "hi"


# --- a cancel asked between a sleep's or a get_event's look and its block ----------------


@durably.workflow(name="wake-races.napper")
async def napper() -> str:
    await durably.sleep(3600)
    return "rested"


@durably.workflow(name="wake-races.event-reader")
async def event_reader() -> Any:
    return await durably.get_event("wake-races-nobody", "ready", timeout=3600)


async def test_a_cancel_asked_while_a_sleep_commits_its_timer_is_delivered_at_once(
    store_url: str,
) -> None:
    """The cancel, and its poke of the run, come after the sleep's commit and before the
    sleep blocks: the poke finds no wait. The sleep must look again (the cancel is
    delivered at once), not block until its hold runs out (30 s here) and the park finds
    the cancel."""
    wid = "wake-races-napper"
    async with durably.Engine(store_url, hold_seconds=30, poll_interval=30) as engine:

        async def cancel() -> None:
            assert await engine.cancel(wid) == [wid]

        after_verb(engine, "append_entries", cancel)
        handle = await engine.start(napper, workflow_id=wid)
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=5)


async def test_a_cancel_asked_while_a_get_event_reads_is_delivered_at_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for ``get_event``: the cancel's poke comes after its read found nothing
    and before it blocks until the next read (30 s here, well within the hold, so no park
    looks again)."""
    monkeypatch.setattr(messages, "_POLL", (30.0, 30.0))
    wid = "wake-races-event-reader"
    async with durably.Engine(store_url, hold_seconds=60, poll_interval=30) as engine:

        async def cancel() -> None:
            assert await engine.cancel(wid) == [wid]

        after_verb(engine, "read_event", cancel)
        handle = await engine.start(event_reader, workflow_id=wid)
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=5)


@durably.step(retry=durably.Retry(max_attempts=2, initial=3600, max_delay=3600, jitter=0))
def flaky() -> str:
    raise RuntimeError("down")


@durably.workflow(name="wake-races.retrier")
async def retrier() -> str:
    return await flaky()


async def test_a_cancel_asked_while_a_failed_attempt_commits_is_delivered_at_once(
    store_url: str,
) -> None:
    """The same for a step's back-off between attempts: the cancel's poke comes after the
    failed attempt's commit and before the back-off blocks."""
    wid = "wake-races-retrier"
    async with durably.Engine(store_url, hold_seconds=30, poll_interval=30) as engine:

        async def cancel() -> None:
            assert await engine.cancel(wid) == [wid]

        after_verb(engine, "append_entries", cancel)
        handle = await engine.start(retrier, workflow_id=wid)
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=5)
