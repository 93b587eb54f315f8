"""The step path: what a step's commit sends to SQLite, and where a sync step runs.

Speed is never asserted here (see benchmarks/); these tests pin the behaviour the
fast path must keep: a SQLite commit runs its own statements and no others, a
commit on the event loop's thread never waits for another process's write lock
while the store thread still does, and a sync step runs off the event loop.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest

from durably import journal
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
