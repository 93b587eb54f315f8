"""PostgreSQL: while the event loop is quiet, a run's commit is sent from the loop's own
thread on a connection of its own (``PostgresStore.run_inline``), which saves the two
thread wake-ups of the store thread. The loop's thread never connects, never waits for
a row lock longer than ``INLINE_LOCK_TIMEOUT``, and after a slow call leaves the calls
of a while (``postgres.inline_pause``) to the store threads."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

import durably
from durably.storage import postgres
from tests.test_pg_round_trips import plain_steps


def commit_threads(engine: durably.Engine) -> list[str]:
    """The thread each step's commit ran on (the store's verb runs as is)."""
    store: Any = engine._store.store
    seen: list[str] = []
    real = store.append_entries

    def append_entries(*args: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args)

    store.append_entries = append_entries
    return seen


async def run_steps(engine: durably.Engine, n: int) -> None:
    assert await (await engine.start(plain_steps, n)).result(timeout=30) == sum(range(n))


async def inline_conn(engine: durably.Engine) -> Any:
    """The loop's connection, once a store thread has opened it: steps are run until it
    is (it is opened at a store thread's batch after an inline call asked for it, and
    tried again at most every ``INLINE_RECONNECT`` seconds if the server refused)."""
    store: Any = engine._store.store
    deadline = time.monotonic() + 3 * postgres.INLINE_RECONNECT
    while store._inline.conn is None or store._inline.conn.closed:
        assert time.monotonic() < deadline, "the loop's connection was never opened"
        await run_steps(engine, 3)
        await asyncio.sleep(0.05)
    return store._inline.conn


def inline_pid(engine: durably.Engine) -> int:
    conn = engine._store.store._inline.conn
    assert conn is not None and not conn.closed
    return int(conn.info.backend_pid)


async def test_a_quiet_loop_commits_steps_on_its_own_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a loaded machine may take over 20 ms for a commit, which pauses inline commits (the
    # slow-call test below covers that): not what this test is about
    monkeypatch.setattr(postgres, "INLINE_SLOW", 60.0)
    async with durably.Engine(postgres_url) as engine:
        await inline_conn(engine)  # the first steps ask a store thread to open it
        seen = commit_threads(engine)
        await run_steps(engine, 20)
        loop_thread = threading.current_thread().name
        assert seen.count(loop_thread) >= 18, seen  # a stray one may meet a busy loop


async def test_without_inline_commits_no_connection_of_its_own_is_opened(
    postgres_url: str,
) -> None:
    async with durably.Engine(postgres_url, inline_commits=False) as engine:
        seen = commit_threads(engine)
        await run_steps(engine, 10)
        assert engine._store.store._inline.conn is None
        assert threading.current_thread().name not in seen


async def test_the_loops_thread_never_connects_a_lost_connection_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as above: a commit slowed by a loaded machine would pause inline commits, and the
    # last steps would go to a store thread for a reason this test is not about
    monkeypatch.setattr(postgres, "INLINE_SLOW", 60.0)
    async with durably.Engine(postgres_url) as engine:
        lost = int((await inline_conn(engine)).info.backend_pid)  # opened, however loaded
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (lost,))
        seen = commit_threads(engine)
        loop_thread = threading.current_thread().name
        handle = await engine.start(plain_steps, 5, workflow_id="pg-inline-lost")
        assert await handle.result(timeout=30) == 10
        # the first call (the start or a step) found the connection lost and went to a
        # store thread, which sent it again; then, with the connection not opened again
        # yet, every commit went to a store thread; every step is in the journal once
        assert loop_thread not in seen[1:], seen
        history = await engine.history("pg-inline-lost")
        assert [e.seq for e in history] == [1, 2, 3, 4, 5]
        # the store thread opened a new connection meanwhile (at most once in
        # INLINE_RECONNECT seconds): later steps are inline again
        store: Any = engine._store.store
        store._inline_tried = float("-inf")
        await run_steps(engine, 5)
        await run_steps(engine, 10)
        assert inline_pid(engine) != lost
        assert loop_thread in seen[-10:], seen
        assert len(seen) in (20, 21)  # twenty commits, and a step's lost attempt if any


async def test_a_slow_call_sends_the_next_ones_through_the_store_threads(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with durably.Engine(postgres_url) as engine:
        await inline_conn(engine)  # opened, however loaded: the start below goes inline
        monkeypatch.setattr(postgres, "INLINE_SLOW", 0.0)  # every call counts as slow
        monkeypatch.setattr(postgres, "INLINE_PAUSE_MIN", 30.0)  # room for a loaded machine
        seen = commit_threads(engine)
        store: Any = engine._store.store
        await run_steps(engine, 10)  # its start, inline, is the slow one
        loop_thread = threading.current_thread().name
        assert loop_thread not in seen, seen  # then every commit went to a store thread
        left = store._inline_paused_until - time.monotonic()
        assert 25 < left <= 30, left  # a fast call: the shortest pause
        monkeypatch.setattr(postgres, "INLINE_SLOW", 10.0)
        store._inline_paused_until = 0.0  # the pause is over
        await run_steps(engine, 10)
        assert seen[-5:].count(loop_thread) >= 4, seen


def test_the_pause_after_a_slow_call_grows_with_it() -> None:
    """A hiccup pauses inline calls for a second, a stall for thirty times its length,
    a stalled network (a statement cut off at its timeout) for minutes, never longer."""
    assert postgres.inline_pause(0.021) == 1.0
    assert postgres.inline_pause(0.5) == 15.0
    assert postgres.inline_pause(5.0) == 150.0
    assert postgres.inline_pause(3600.0) == 300.0


async def test_a_locked_row_sends_the_commit_to_a_store_thread(postgres_url: str) -> None:
    """The loop's connection waits INLINE_LOCK_TIMEOUT for a row lock, then the store
    thread waits as long as the lock is held; the step commits once."""
    gate = asyncio.Event()

    @durably.step(name="pg-inline.gated")
    async def gated() -> str:
        await gate.wait()
        return "done"

    @durably.workflow(name="pg-inline.locked")
    async def locked() -> str:
        return await gated()

    async with durably.Engine(postgres_url) as engine:
        await inline_conn(engine)  # opened, however loaded: the receipt is tried inline
        seen = commit_threads(engine)
        handle = await engine.start(locked, workflow_id="pg-inline-locked")
        held, release = threading.Event(), threading.Event()

        def hold_the_row() -> None:
            with psycopg.connect(postgres_url) as conn, conn.transaction():
                conn.execute(
                    "SELECT 1 FROM durably.workflows WHERE workflow_id = 'pg-inline-locked' "
                    "FOR UPDATE"
                )
                held.set()
                release.wait(5)

        holder = threading.Thread(target=hold_the_row)
        holder.start()
        assert await asyncio.to_thread(held.wait, 5)
        gate.set()
        await asyncio.sleep(0.3)
        # Read on a connection of its own: the engine's one store thread is waiting for
        # the row, so handle.status() would queue behind that commit until its lock_timeout
        # (5 s) and the retry after it, which may go inline, would decide the thread seen.
        with psycopg.connect(postgres_url, autocommit=True) as reader:
            found = reader.execute(
                "SELECT status FROM durably.workflows WHERE workflow_id = 'pg-inline-locked'"
            ).fetchone()
        assert found == ("running",)  # its receipt waits for the row
        release.set()
        assert await handle.result(timeout=30) == "done"
        holder.join(5)
        loop_thread = threading.current_thread().name
        # tried on the loop's thread, given up at the lock, then sent by a store thread
        assert seen[0] == loop_thread and seen[-1] != loop_thread, seen
        history = await engine.history("pg-inline-locked")
        assert [e.status for e in history] == ["completed"]


async def test_the_loops_connection_has_short_limits_and_the_others_keep_theirs(
    postgres_url: str,
) -> None:
    async with durably.Engine(postgres_url) as engine:
        await run_steps(engine, 3)
        store: Any = engine._store.store
        inline = await inline_conn(engine)
        assert inline.execute("SHOW lock_timeout").fetchone() == (postgres.INLINE_LOCK_TIMEOUT,)
        assert inline.execute("SHOW statement_timeout").fetchone() == (
            postgres.INLINE_STATEMENT_TIMEOUT,
        )
        assert inline.info.get_parameters()["keepalives_idle"] == "5"
        others = [c for c in store._connections if c is not inline]
        assert others
        for conn in others:  # the store threads wait for locks as long as they must
            assert conn.execute("SHOW lock_timeout").fetchone() == ("5s",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
