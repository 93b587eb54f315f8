"""The step path: what a step's commit sends to SQLite, and where a sync step runs.

Speed is never asserted here (see benchmarks/); these tests pin the behaviour the
fast path must keep: a SQLite commit runs its own statements and no others, a
commit on the event loop's thread never waits for another process's write lock
while the store thread still does, and a sync step runs off the event loop, which
only ever waits for it briefly.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

import durably
from durably import context, journal
from durably.storage import base, create_store
from durably.storage.sqlite import SqliteStore

NOW = 1_000_000.0


def _entry(seq: int) -> journal.Entry:
    return journal.Entry(seq, "step", "s", "completed", 1, f'{{"n":{seq}}}', NOW, NOW)


@pytest.fixture
def owned(sqlite_url: str) -> Iterator[tuple[SqliteStore, int]]:
    """An open SQLite store holding workflow ``wf`` owned at its epoch."""
    store = create_store(sqlite_url)
    assert isinstance(store, SqliteStore)
    store.open()
    op = base.Op(
        store.create_workflow,
        (base.NewWorkflow("wf", "flow", "[]", None, None), "me", NOW + 60, NOW),
        write=True,
    )
    store.run_batch([op])
    assert op.error is None, op.error
    info, _ = op.result
    yield store, info.epoch
    store.close()


def _first_word(statement: str) -> str:
    """The statement's first keyword, after the comment lines queries.sql gives it."""
    code = [ln for ln in statement.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    return code[0].split()[0].upper()


def _append(store: SqliteStore, epoch: int, seq: int) -> base.Op:
    return base.Op(store.append_entries, ("wf", epoch, [_entry(seq)], NOW), write=True)


def test_a_sqlite_step_commit_sends_only_its_own_statements(
    owned: tuple[SqliteStore, int],
) -> None:
    """Each commit of a step's receipt is BEGIN IMMEDIATE, the fence, the insert and
    COMMIT, whether it runs inline (on the event loop's thread) or on the store
    thread; the only other statement is one setting of how long to wait for a lock
    when the connection passes from one path to the other."""
    store, epoch = owned
    sent: list[str] = []
    store.conn.set_trace_callback(sent.append)
    paths = ["inline"] * 5 + ["thread"] * 3 + ["inline"] * 2
    for seq, path in enumerate(paths, start=1):
        op = _append(store, epoch, seq)
        if path == "inline":
            assert store.run_inline(op) is True
        else:
            store.run_batch([op])
        assert op.error is None, op.error
    store.conn.set_trace_callback(None)

    pragmas = [s for s in sent if s.upper().startswith("PRAGMA")]
    own = [s for s in sent if not s.upper().startswith("PRAGMA")]
    assert len(own) == 4 * len(paths), own
    for i in range(len(paths)):
        begin, fence, insert, commit = own[4 * i : 4 * i + 4]
        assert begin == "BEGIN IMMEDIATE", own[4 * i : 4 * i + 4]
        assert _first_word(fence) == "SELECT", fence
        assert _first_word(insert) == "INSERT", insert
        assert commit == "COMMIT", commit
    # The store left the connection waiting for locks (open), the first inline commit
    # stops waiting, the thread waits again, and the inline path stops again: three.
    assert pragmas == [
        "PRAGMA busy_timeout = 0",
        f"PRAGMA busy_timeout = {store.busy_timeout_ms}",
        "PRAGMA busy_timeout = 0",
    ], pragmas


def test_an_inline_commit_never_waits_for_a_lock_and_the_store_thread_still_does(
    owned: tuple[SqliteStore, int],
) -> None:
    """Another process holding the write lock: the inline path gives up at once,
    committing nothing, and the store thread's commit then waits for the lock."""
    store, epoch = owned
    other = sqlite3.connect(store.path, isolation_level=None, timeout=0, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        first = _append(store, epoch, 1)
        t0 = time.monotonic()
        assert store.run_inline(first) is False
        refused_in = time.monotonic() - t0
        assert first.error is None and first.result is None
        # busy_timeout is 5 s: an inline commit that waited would be stuck until release.
        assert refused_in < 2.0, f"the inline commit waited {refused_in:.2f}s for the lock"

        release = threading.Timer(0.3, other.execute, ("ROLLBACK",))
        release.start()
        try:
            store.run_batch([first])  # what the store thread does with the refused op
        finally:
            release.join()
        assert first.error is None, f"the store thread did not wait for the lock: {first.error}"
    finally:
        other.close()
    # Committed once, at seq 1; the next inline commit goes through.
    second = _append(store, epoch, 2)
    assert store.run_inline(second) is True and second.error is None
    read = base.Op(store.load_history, ("wf",), write=False)
    store.run_batch([read])
    assert [e.seq for e in read.result] == [1, 2]


# --- sync steps: on a step thread, the loop free, their outcome as it was ------------------

_loop_threads: list[int] = []


@durably.step
def where_am_i(tag: str) -> dict[str, object]:
    info = durably.step_info()  # the step's context reaches the thread
    return {"thread": threading.get_ident(), "seq": info.seq, "tag": tag}


@durably.step
def nap(seconds: float) -> str:
    time.sleep(seconds)  # blocks its thread, never the loop
    return "rested"


@durably.step
def own_timeout() -> None:
    raise TimeoutError("the step's own timeout, not the engine's")


@durably.workflow(name="sp.sync")
async def sync_flow() -> list[object]:
    _loop_threads.append(threading.get_ident())
    first = await where_am_i("a")
    second = await where_am_i("b")
    rested = await nap(0.6)
    try:
        await own_timeout()
    except TimeoutError as exc:
        caught = str(exc)
    return [first, second, rested, caught]


async def test_a_sync_step_runs_on_a_step_thread_and_leaves_the_loop_free(
    store_url: str,
) -> None:
    """A sync step runs off the event loop's thread, with its step context, however
    long it takes: a ticker on the loop keeps ticking through a 0.6 s step. Its
    result, and an error it raises (even a TimeoutError of its own), come back as
    they were."""
    gaps: list[float] = []

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now

    _loop_threads.clear()
    async with durably.Engine(store_url) as engine:
        tick = asyncio.create_task(ticker())
        try:
            handle = await engine.start(sync_flow, workflow_id="sync-1")
            first, second, rested, caught = await handle.result(timeout=60)
        finally:
            tick.cancel()
    loop_thread = _loop_threads[0]
    assert first["thread"] != loop_thread and second["thread"] != loop_thread
    assert (first["seq"], first["tag"], second["seq"], second["tag"]) == (1, "a", 2, "b")
    assert rested == "rested"
    assert caught == "the step's own timeout, not the engine's"
    assert len(gaps) > 20, gaps
    assert max(gaps) < 0.3, f"the loop was held {max(gaps):.3f}s while a sync step slept"


@durably.step
async def _plain_step(n: int) -> int:
    return n + 1


@durably.step
def _sync_step(n: int) -> int:
    return n + 1


_runs_seen: list[weakref.ref[object]] = []


@durably.workflow
async def _kept_track_of(n: int, how: str = "steps") -> int:
    _runs_seen.append(weakref.ref(context.current_run.get()))
    if how == "parks":  # parked on the signal, then woken and replayed
        await durably.wait_for_signal("go")
    elif how == "fails":
        raise ValueError(f"failed {n}")
    return await _sync_step(await _plain_step(n))


@pytest.mark.parametrize("how", ["steps", "parks", "fails"])
async def test_a_finished_run_is_freed_without_the_cyclic_collector(
    store_url: str, how: str
) -> None:
    """A run that ended (or parked) is freed as soon as the engine lets go of it: nothing
    in it refers back to it, so no garbage waits for the cyclic collector (whose passes
    over every finished run were 6-8% of a busy engine's time)."""
    _runs_seen.clear()
    async with durably.Engine(store_url) as engine:
        await (await engine.start(_kept_track_of, 0)).result()  # warm
        gc.collect()
        gc.disable()
        try:
            handles = [await engine.start(_kept_track_of, i, how) for i in range(10)]
            if how == "parks":
                for h in handles:
                    while await h.status() != durably.Status.WAITING:
                        await asyncio.sleep(0.005)
                    await engine.send_signal(h.workflow_id, "go")
            for i, h in enumerate(handles):
                if how == "fails":
                    with pytest.raises(ValueError, match=f"failed {i}"):
                        await h.result()
                else:
                    assert await h.result() == i + 2
            for _ in range(5):  # the engine forgets a task a callback after it ended
                await asyncio.sleep(0)
            runs = _runs_seen[1:]
            assert len(runs) == (20 if how == "parks" else 10)  # a parked one runs twice
            alive = [ref for ref in runs if ref() is not None]
            assert alive == [], f"{len(alive)} of {len(runs)} runs wait for the collector"
        finally:
            gc.enable()
