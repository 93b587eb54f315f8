"""Commits made while the event loop is busy, gathered and run together on its thread at
its next turn (SQLite, ``Store.gathers_inline``): one transaction for the lot, in the
order they were made, none run for a caller gone, each one the database refuses (a
lock another process holds) handed to the store thread, which waits for it while the
loop goes on, and a batch that stalled sending the next ones to the store thread.

Every test runs a real SQLite file through ``StoreThread``; the verbs are functions that
record where and in which order they ran, or write rows of a table of their own, as a
store's verbs write theirs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import errors
from durably.storage import base, create_store, thread
from durably.storage.sqlite import SqliteStore

Log = list[tuple[object, str]]


def rec(log: Log, tag: object) -> object:
    """A verb that notes its tag and the thread it ran on."""
    log.append((tag, threading.current_thread().name))
    return tag


def boom(log: Log, tag: object) -> object:
    log.append((tag, threading.current_thread().name))
    raise ValueError(f"verb {tag} fails")


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[thread.StoreThread]:
    store = create_store(f"sqlite:///{tmp_path / 'g.db'}")
    assert store.gathers_inline
    runner = thread.StoreThread(store)
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


def _begins(store: Any) -> Callable[[], list[str]]:
    """Start noting the connection's statements; the returned function reads the
    ``BEGIN`` statements noted so far, each with the thread that sent it."""
    sent: list[str] = []
    store.conn.set_trace_callback(
        lambda text: sent.append(f"{threading.current_thread().name}: {text}")
    )
    return lambda: [s for s in sent if s.endswith("BEGIN IMMEDIATE")]


async def _together(*calls: Any) -> list[Any]:
    """Start the calls as tasks in this order (each finds the others ready on the loop)
    and gather their outcomes."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_calls_of_a_busy_loop_commit_together_on_its_thread(
    runner: thread.StoreThread,
) -> None:
    log: Log = []
    begins = _begins(runner.store)
    got = await _together(*(runner.call(rec, log, i, inline=True) for i in range(5)))
    assert got == [0, 1, 2, 3, 4]
    main = threading.current_thread().name
    assert log == [(i, main) for i in range(5)]  # in the order made, on the loop's thread
    assert begins() == [f"{main}: BEGIN IMMEDIATE"]  # one transaction for the five


async def test_without_inline_the_same_calls_go_to_the_store_thread(
    runner: thread.StoreThread,
) -> None:
    log: Log = []
    got = await _together(*(runner.call(rec, log, i) for i in range(3)))
    assert got == [0, 1, 2]
    assert {name for _, name in log} == {"durably-store"}


async def test_a_call_queued_to_the_thread_commits_after_the_gathered_ones_made_before(
    runner: thread.StoreThread,
) -> None:
    log: Log = []
    got = await _together(
        runner.call(rec, log, "a", inline=True),
        runner.call(rec, log, "b", inline=True),
        runner.call(rec, log, "c"),  # not inline: queued behind a and b, not ahead
        runner.call(rec, log, "d", inline=True),  # behind c: c is still pending
    )
    assert got == ["a", "b", "c", "d"]
    assert [tag for tag, _ in log] == ["a", "b", "c", "d"]
    assert {name for _, name in log} == {"durably-store"}


async def test_a_gathered_call_whose_caller_is_gone_is_not_run(
    runner: thread.StoreThread,
) -> None:
    log: Log = []
    first = asyncio.ensure_future(runner.call(rec, log, "gone", inline=True))
    second = asyncio.ensure_future(runner.call(rec, log, "kept", inline=True))
    await asyncio.sleep(0)  # both are gathered now; the batch runs at the next turn
    assert first.cancel()
    assert await second == "kept"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert [tag for tag, _ in log] == ["kept"]


async def test_a_failing_call_fails_alone_and_the_others_commit_once(
    runner: thread.StoreThread,
) -> None:
    store: Any = runner.store
    await runner.call(lambda: store.conn.execute("CREATE TABLE kept (tag TEXT)"))

    def write(tag: str) -> str:
        store.conn.execute("INSERT INTO kept VALUES (?)", (tag,))
        return tag

    log: Log = []
    got = await _together(
        runner.call(write, "a", inline=True),
        runner.call(boom, log, "b", inline=True),
        runner.call(write, "c", inline=True),
    )
    assert got[0] == "a" and got[2] == "c"
    assert isinstance(got[1], ValueError) and "verb b fails" in str(got[1])
    rows = await runner.call(lambda: store.conn.execute("SELECT tag FROM kept").fetchall())
    assert sorted(r[0] for r in rows) == ["a", "c"]  # the first try was undone, not kept


async def test_a_lock_held_elsewhere_sends_the_batch_to_the_store_thread_and_frees_the_loop(
    runner: thread.StoreThread,
) -> None:
    path = runner.store.path  # type: ignore[attr-defined]
    other = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's writer, for 0.4 s
    release = threading.Timer(0.4, other.execute, ("ROLLBACK",))
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    ticking = asyncio.ensure_future(ticker())
    log: Log = []
    release.start()
    try:
        t0 = time.monotonic()
        got = await _together(*(runner.call(rec, log, i, inline=True) for i in range(4)))
        waited = time.monotonic() - t0
    finally:
        release.join()
        ticking.cancel()
        other.close()
    assert got == [0, 1, 2, 3]
    # refused on the loop's thread (nothing run there), run by the store thread once free
    assert log == [(i, "durably-store") for i in range(4)]
    assert waited >= 0.3
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 15 and max(gaps) < 0.2, (len(ticks), max(gaps))


async def test_a_slow_batch_sends_the_calls_of_a_while_to_the_store_thread(
    runner: thread.StoreThread, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(thread, "GATHER_SLOW", 0.01)

    def slow(log: Log, tag: object) -> object:
        time.sleep(0.05)  # a disk that stalls in its fsync
        return rec(log, tag)

    log: Log = []
    main = threading.current_thread().name
    with caplog.at_level(logging.INFO, logger="durably"):
        assert await _together(
            runner.call(slow, log, "slow", inline=True), runner.call(rec, log, 1, inline=True)
        ) == ["slow", 1]
    assert log == [("slow", main), (1, main)]
    assert "group commit on the event loop's thread took" in caplog.text
    left = runner._gather_paused_until - time.monotonic()
    assert 1.0 < left < 6.0  # 30 times the batch's 50 ms and more

    log.clear()
    assert await _together(*(runner.call(rec, log, i, inline=True) for i in range(3))) == [0, 1, 2]
    assert {name for _, name in log} == {"durably-store"}  # paused: through the thread

    runner._gather_paused_until = 0.0  # the pause is over
    log.clear()
    assert await _together(*(runner.call(rec, log, i, inline=True) for i in range(3))) == [0, 1, 2]
    assert {name for _, name in log} == {main}


async def test_calls_gathered_as_the_store_closes_are_finished_then_refused(
    tmp_path: Path,
) -> None:
    runner = thread.StoreThread(create_store(f"sqlite:///{tmp_path / 'c.db'}"))
    runner.start()
    log: Log = []
    first = asyncio.ensure_future(runner.call(rec, log, "a", inline=True))
    second = asyncio.ensure_future(runner.call(rec, log, "b", inline=True))
    await asyncio.sleep(0)  # gathered; the batch would run at the next turn
    runner.stop()  # finishes the calls made before it, as it finishes queued ones
    assert [await first, await second] == ["a", "b"]
    assert log == [("a", "durably-store"), ("b", "durably-store")]
    asyncio.get_running_loop().call_soon(lambda: None)  # busy: it would be gathered
    with pytest.raises(errors.DatabaseUnavailable, match="closed"):
        await runner.call(rec, log, "c", inline=True)


def named(tag: str, log: Log) -> str:
    """A verb whose first argument names a workflow, as a store's verbs do."""
    log.append((tag, threading.current_thread().name))
    return tag


async def test_a_batch_runs_in_lock_order_and_its_callers_hear_in_the_order_they_called(
    runner: thread.StoreThread,
) -> None:
    log: Log = []
    heard: list[str] = []
    got = await _together(
        *(runner.call(named, tag, log, inline=True, then=heard.append) for tag in "cab")
    )
    assert got == ["c", "a", "b"]
    assert [tag for tag, _ in log] == ["a", "b", "c"]  # the rows' lock order
    assert heard == ["c", "a", "b"]


async def test_more_than_a_batch_is_gathered_into_batches_at_the_next_turns(
    tmp_path: Path,
) -> None:
    runner = thread.StoreThread(create_store(f"sqlite:///{tmp_path / 'm.db'}"), max_batch=2)
    runner.start()
    try:
        begins = _begins(runner.store)
        log: Log = []
        got = await _together(*(runner.call(rec, log, i, inline=True) for i in range(5)))
    finally:
        runner.stop()
    main = threading.current_thread().name
    assert got == [0, 1, 2, 3, 4]
    assert log == [(i, main) for i in range(5)]
    assert begins() == [f"{main}: BEGIN IMMEDIATE"] * 3


async def test_a_store_shared_by_two_loops_runs_each_loops_calls_on_its_own_thread(
    runner: thread.StoreThread,
) -> None:
    # Loop one gathers a call and is held before its turn; loop two makes a call that goes
    # to the store thread (taking loop one's with it), then gathers one of its own: loop
    # one's turn, when it comes, must not run loop two's call on loop one's thread.
    log: Log = []
    gathered, go_on = threading.Event(), threading.Event()
    out: dict[str, object] = {}

    def loop_one() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(runner.call(rec, log, "A", inline=True))
            await asyncio.sleep(0)  # A gathered; its turn is next
            gathered.set()
            go_on.wait(10)  # held before that turn
            out["A"] = await task

        asyncio.run(main())

    def loop_two() -> None:
        async def main() -> None:
            assert gathered.wait(10)
            out["B"] = (await _together(runner.call(rec, log, "B", inline=True)))[0]
            while runner._pending:  # answered once the thread is done with A and B
                await asyncio.sleep(0.001)
            task = asyncio.ensure_future(runner.call(rec, log, "C", inline=True))
            await asyncio.sleep(0)  # C gathered by this loop
            go_on.set()
            await asyncio.sleep(0.2)  # loop one's turn comes meanwhile
            out["C"] = await asyncio.wait_for(task, 10)

        asyncio.run(main(), debug=True)  # a future set from another thread raises here

    threads = [
        threading.Thread(target=loop_one, name="loop-one"),
        threading.Thread(target=loop_two, name="loop-two"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {"A": "A", "B": "B", "C": "C"}
    assert ("C", "loop-two") in log, log


# --- through an engine --------------------------------------------------------------------


@durably.step
async def bump(i: int) -> int:
    return i + 1


@durably.workflow(name="gathered.three")
async def three_steps(i: int) -> int:
    for _ in range(3):
        i = await bump(i)
    return i


@pytest.mark.parametrize("inline", [True, False])
async def test_workflows_in_flight_share_commits_on_the_loops_thread(
    tmp_path: Path, inline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch slowed by a loaded machine would pause gathering (tested above), sending the
    # rest to the store thread: not what this test counts.
    monkeypatch.setattr(thread, "GATHER_SLOW", 60.0)
    async with durably.Engine(f"sqlite:///{tmp_path / 'e.db'}", inline_commits=inline) as engine:
        store: SqliteStore = engine._store.store  # type: ignore[assignment]
        begins = _begins(store)
        handles = [await engine.start(three_steps, i) for i in range(40)]
        assert [await h.result(timeout=30) for h in handles] == [i + 3 for i in range(40)]
        store.conn.set_trace_callback(None)
        noted = begins()
    commits = 40 * 5  # each workflow's start, three steps and finish
    assert len(noted) < commits / 2, len(noted)  # group commits either way
    on_loop = [b for b in noted if b.startswith(threading.current_thread().name + ":")]
    if inline:  # the loop's thread ran nearly all of them, none waking the store thread
        assert len(on_loop) >= 0.8 * len(noted), noted
    else:
        assert on_loop == [], on_loop


def test_a_batch_is_refused_only_when_nothing_of_it_was_committed(tmp_path: Path) -> None:
    store: Any = create_store(f"sqlite:///{tmp_path / 'r.db'}")
    store.open()
    try:
        store.conn.execute("CREATE TABLE kept (tag TEXT)")

        def write(tag: str) -> str:
            store.conn.execute("INSERT INTO kept VALUES (?)", (tag,))
            return tag

        def locked(tag: str) -> str:
            raise errors.DatabaseLocked(f"{tag}: a lock of its own")

        ops = [
            base.Op(write, ("a",), True),
            base.Op(locked, ("b",), True),
            base.Op(write, ("c",), True),
        ]
        # a and c committed: b's lock error is its own, not a refusal of the batch
        assert store.run_inline_batch(ops) == [True, True, True]
        assert isinstance(ops[1].error, errors.DatabaseLocked)
        assert [op.result for op in (ops[0], ops[2])] == ["a", "c"]

        other = sqlite3.connect(store.path, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # another process's writer: nothing can begin
        try:
            ops = [base.Op(write, ("d",), True), base.Op(write, ("e",), True)]
            assert store.run_inline_batch(ops) == [False, False]
            assert all(op.error is None and op.result is None for op in ops)
        finally:
            other.execute("ROLLBACK")
            other.close()
        rows = store.conn.execute("SELECT tag FROM kept ORDER BY tag").fetchall()
        assert [r[0] for r in rows] == ["a", "c"]
    finally:
        store.close()
