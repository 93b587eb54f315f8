"""Promises checked at their edges: one commit per step, the store's fence, gather + failure."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import durably
from durably import journal
from durably.storage import base, create_store, thread

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@durably.step
async def mark(name: str) -> str:
    RAN.append(name)
    return name


@durably.workflow
async def three_steps_with_events() -> list[str]:
    out = []
    for n in range(3):
        durably.set_event("progress", n)
        out.append(await mark(f"s{n}"))
    return out


async def test_a_plain_step_costs_one_commit(sqlite_url: str, monkeypatch: Any) -> None:
    from durably.storage import sqlite

    writes: list[str] = []
    for verb in ("create_workflow", "append_entries", "finish_workflow", "park"):
        real = getattr(sqlite.SqliteStore, verb)

        def counting(self: Any, *args: Any, _real: Any = real, _verb: str = verb) -> Any:
            writes.append(_verb)
            return _real(self, *args)

        monkeypatch.setattr(sqlite.SqliteStore, verb, counting)
    async with durably.Engine(sqlite_url) as e:
        handle = await e.start(three_steps_with_events, workflow_id="one-commit")
        assert await handle.result(timeout=5) == ["s0", "s1", "s2"]
    # one write for the start, one per step (events ride with the receipts), one to finish
    assert writes == ["create_workflow"] + ["append_entries"] * 3 + ["finish_workflow"]
    with durably.Client(sqlite_url) as client:
        assert client.get_event("one-commit", "progress") == 2


def test_the_store_rejects_writes_after_park_or_finish(sqlite_url: str) -> None:
    runner = thread.StoreThread(create_store(sqlite_url))
    runner.start()
    store = runner.store
    try:
        new = base.NewWorkflow("w", "flow", '{"args":[],"kwargs":{}}', None, None)
        info, _ = runner.call_sync(store.create_workflow, new, "me", 1e12, 1.0)
        entry = journal.Entry(1, "step", "a", "completed", 1, "1", 1.0, 1.0)
        runner.call_sync(store.park, "w", info.epoch, "sleeping", 5.0, [entry], [], [], 2.0)
        late = journal.Entry(2, "step", "b", "completed", 1, "2", 3.0, 3.0)
        with pytest.raises(durably.FencedError):
            runner.call_sync(store.append_entries, "w", info.epoch, [late], 3.0)
        assert [e.seq for e in runner.call_sync(store.load_history, "w")] == [1]
    finally:
        runner.stop()


class Boom(Exception):
    pass


@durably.step
async def fail_fast() -> None:
    RAN.append("fail_fast")
    raise Boom("fast branch failed")


@durably.step
async def slow() -> str:
    await asyncio.sleep(0.3)
    RAN.append("slow")
    return "slow done"


@durably.workflow
async def gather_with_failure() -> Any:
    return await asyncio.gather(fail_fast(), slow())


async def test_a_failing_branch_lets_its_sibling_commit_before_the_workflow_ends(
    sqlite_url: str,
) -> None:
    async with durably.Engine(sqlite_url) as e:
        with pytest.raises(Boom):
            await (await e.start(gather_with_failure, workflow_id="g")).result(timeout=5)
        history = {x.name: x.status for x in await e.history("g")}
    assert history == {"fail_fast": "failed", "slow": "completed"}
    assert RAN == ["fail_fast", "slow"]


@durably.workflow
async def cancel_with_cleanup() -> str:
    try:
        await durably.wait_for_signal("never")
        return "no"
    finally:
        await mark("cleanup")


async def test_resuming_a_cancelled_workflow_that_ran_cleanup_is_refused(sqlite_url: str) -> None:
    async with durably.Engine(sqlite_url, hold_seconds=0.05) as e:
        handle = await e.start(cancel_with_cleanup, workflow_id="cc")
        await asyncio.sleep(0.2)
        await e.cancel("cc")
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=5)
        with pytest.raises(durably.DurablyError, match="fork it instead"):
            await e.resume("cc")
    assert RAN == ["cleanup"]


async def test_an_empty_workflow_id_is_refused(sqlite_url: str) -> None:
    with durably.Client(sqlite_url) as client, pytest.raises(ValueError, match="non-empty"):
        client.start(three_steps_with_events, workflow_id="")


@durably.step
async def quick(i: int) -> int:
    return i


@durably.workflow
async def many_quick_steps(n: int) -> int:
    total = 0
    for i in range(n):
        total += await quick(i)
    return total


async def test_a_long_run_of_inline_commits_leaves_the_event_loop_free(sqlite_url: str) -> None:
    gaps: list[float] = []

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    # What is tested is that the run yields to the loop, not what else can stop a
    # process: in the whole suite 0.41-0.48 s pauses were seen (a worker's full garbage
    # collection of all the earlier tests left, or an fsync on the busy disk). So the
    # collector waits, and NORMAL has no fsync a commit.
    gc.collect()
    gc.disable()
    try:
        took = await _inline_commits_beside(ticker, sqlite_url)
    finally:
        gc.enable()
    assert max(gaps) < 0.2, f"the loop was blocked for {max(gaps):.3f}s during a {took:.2f}s run"


async def _inline_commits_beside(
    ticker: Callable[[], Coroutine[Any, Any, None]], sqlite_url: str
) -> float:
    """Run ``ticker`` beside ever longer workflows of inline commits; returns how long
    the last one took."""
    async with durably.Engine(f"{sqlite_url}?synchronous=normal") as e:
        tick = asyncio.create_task(ticker())
        loop = asyncio.get_running_loop()
        # One workflow of inline commits, twice as long each time until it lasts long
        # enough that a starved ticker would show it (0.4 s), however fast the machine:
        # the ticker could run only between two workflows. A bound, not a hope.
        steps = 2000
        while True:
            began = loop.time()
            handle = await e.start(many_quick_steps, steps, workflow_id=f"quick-{steps}")
            assert await handle.result() == sum(range(steps))
            if (took := loop.time() - began) >= 0.4:
                break
            assert steps < 2_000_000, f"{steps} steps took only {took:.2f}s"
            steps *= 2
        await asyncio.sleep(0.02)  # the ticker notes the gap the last workflow left, if any
        tick.cancel()
    return took
