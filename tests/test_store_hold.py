"""A store call made while the event loop is quiet may hold the loop's thread for at most
``HOLD_LOOP`` waiting for the store thread; a call that takes longer (a row locked by
another process) is awaited like any other, and the loop serves everything else meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import psycopg
import pytest

import durably
from durably.storage import create_store, thread

GATE: dict[str, asyncio.Event] = {}


@durably.step
async def wait_for_gate(key: str) -> str:
    await GATE[key].wait()
    return key


@durably.workflow(name="hold-gated")
async def gated(key: str) -> str:
    return await wait_for_gate(key)


async def test_a_commit_waiting_for_a_locked_row_does_not_hold_the_loop(postgres_url: str) -> None:
    GATE["a"] = asyncio.Event()
    async with durably.Engine(postgres_url) as engine:
        handle = await engine.start(gated, "a", workflow_id="a")
        locked, release = threading.Event(), threading.Event()

        def hold_the_row() -> None:  # another process's transaction, holding the row 0.5 s
            with psycopg.connect(postgres_url) as conn, conn.transaction():
                conn.execute("SELECT 1 FROM durably.workflows WHERE workflow_id = 'a' FOR UPDATE")
                locked.set()
                release.wait(5)

        holder = threading.Thread(target=hold_the_row)
        holder.start()
        assert await asyncio.to_thread(locked.wait, 5)
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        GATE["a"].set()  # the step returns; its receipt waits for the row
        await asyncio.sleep(0.5)
        release.set()
        assert await handle.result(timeout=30) == "a"
        ticking.cancel()
        holder.join(5)
        # the loop went on while the commit waited: no gap between ticks anywhere near 0.5 s
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert len(ticks) >= 20 and max(gaps) < 0.25, (len(ticks), max(gaps))
        assert thread.HOLD_LOOP <= 0.001
        assert [e.status for e in await engine.history("a")] == ["completed"]


async def test_a_quiet_loop_does_not_hold_for_a_call_queued_behind_others(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hold long enough to see: a call that waited behind another's would keep the loop's
    # thread that long, and with it the answers of the calls ahead of it (with a hundred
    # workflows in flight, most holds ran out so: 1-2 ms each, a third of the loop's time).
    monkeypatch.setattr(thread, "HOLD_LOOP", 2.0)
    runner = thread.StoreThread(create_store(sqlite_url))
    runner.start()
    try:
        store = runner.store
        release = threading.Event()

        def slow() -> list[Any]:  # a batch the store thread is busy with until released
            assert release.wait(10)
            return store.list_workflows(None, None, 1)

        ahead = asyncio.ensure_future(runner.call(slow))
        await asyncio.sleep(0.05)  # on the store thread now
        began = time.monotonic()
        released_at: list[float] = []

        def let_go() -> None:  # runs on the loop: only if its thread is not held
            released_at.append(time.monotonic() - began)
            release.set()

        asyncio.get_running_loop().call_later(0.05, let_go)
        assert await runner.call(store.get_workflow, "none", inline=True) is None
        assert await ahead == []
        assert released_at and released_at[0] < 1.0, released_at
    finally:
        runner.stop()
