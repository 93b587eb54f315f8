"""PostgreSQL: a store thread per connection, so commits of concurrent workflows do not
wait behind each other's round trips or locks (``?connections=N``; 1 by default)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from durably import errors
from durably.storage import base, create_store, marks, thread
from tests.test_pg_round_trips import lock_waiters
from tests.test_store import LEASE, NOW, new, step


def with_option(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


def test_connections_come_from_the_url(postgres_url: str) -> None:
    assert create_store(postgres_url).threads == 1
    assert create_store(with_option(postgres_url, "connections=4")).threads == 4
    assert create_store(with_option(postgres_url, "connections=1")).threads == 1
    assert create_store(with_option(postgres_url, "connections=16")).threads == 16


@pytest.mark.parametrize("value", ["0", "65", "two", "", "-1", "2&connections=3"])
def test_a_bad_connections_option_is_refused_naming_it(value: str) -> None:
    url = f"postgresql://u:sekrit@localhost/db?sslmode=disable&connections={value}"
    with pytest.raises(errors.DatabaseURLError, match="connections=") as caught:
        create_store(url)
    assert "sekrit" not in str(caught.value)


@pytest.fixture
def runner(postgres_url: str) -> Iterator[Any]:
    store_thread = thread.StoreThread(create_store(with_option(postgres_url, "connections=4")))
    store_thread.start()
    yield store_thread
    store_thread.stop()


def test_a_commit_does_not_wait_behind_another_held_by_a_lock(
    runner: Any, postgres_url: str
) -> None:
    """a's commit waits for a row lock another session holds; b's, queued after it, is
    committed meanwhile on another connection (one connection would make it wait)."""
    store = runner.store
    a, _ = runner.call_sync(store.create_workflow, new("a"), "ex-a", NOW + LEASE, NOW)
    b, _ = runner.call_sync(store.create_workflow, new("b"), "ex-a", NOW + LEASE, NOW)
    rival = psycopg.connect(postgres_url, autocommit=True)
    try:
        rival.execute("BEGIN")
        rival.execute("SELECT 1 FROM durably.workflows WHERE workflow_id = 'a' FOR UPDATE")
        held = runner.submit(store.append_entries, "a", a.epoch, [step(1)], NOW)
        deadline = time.monotonic() + 30
        while lock_waiters(postgres_url) == (0,):
            assert not held.done(), f"a's commit did not wait for the lock: {held.exception()}"
            assert time.monotonic() < deadline, "a's commit never waited for the lock"
            time.sleep(0.01)
        free = runner.submit(store.append_entries, "b", b.epoch, [step(1)], NOW)
        assert free.result(timeout=4) is False  # within lock_timeout (5 s): not behind a
        assert not held.done()
        rival.execute("COMMIT")
        assert held.result(timeout=30) is False
    finally:
        rival.close()
    assert runner.call_sync(store.load_history, "a") == [step(1)]
    assert runner.call_sync(store.load_history, "b") == [step(1)]


def sessions(url: str) -> int:
    """durably's sessions on the database (its application_name), seen from a new one."""
    with psycopg.connect(url, autocommit=True) as observer:
        row = observer.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'durably'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_stop_closes_every_threads_connection(postgres_url: str) -> None:
    runner = thread.StoreThread(create_store(with_option(postgres_url, "connections=3")))
    runner.start()
    store = runner.store
    try:
        # Keep every thread busy at once, so that each opens its connection.
        futures = [runner.submit(store.get_workflow, f"w{i}") for i in range(300)]
        assert [f.result(timeout=30) for f in futures] == [None] * 300
        assert 1 <= sessions(postgres_url) <= 3
    finally:
        runner.stop()
    deadline = time.monotonic() + 10
    while sessions(postgres_url):  # a closed session leaves pg_stat_activity shortly after
        assert time.monotonic() < deadline, "a store connection is still open after stop()"
        time.sleep(0.01)


def test_verbs_that_lock_many_workflows_run_alone(runner: Any) -> None:
    """A heartbeat renews every lease of its executor in one statement; beside a batch
    holding some of those rows and waiting for one it has renewed, the two would wait for
    each other. Such verbs wait for the batches in flight and hold new ones back."""
    store = runner.store
    lone = ["heartbeat", "keep_leases", "release_owned", "remove_executor", "request_cancel",
            "send_signals", "prune", "delete_workflows", "delete_selected", "cancel_selected",
            "resume_selected", "import_workflows"]  # fmt: skip
    assert [v for v in lone if not marks.runs_alone(getattr(store, v))] == []
    assert not marks.runs_alone(store.append_entries)

    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def batch() -> bool:
        started.set()
        released = release.wait(2)  # set by the lone verb, were it to run meanwhile
        order.append("batch")
        return released

    @marks.alone
    def alone_verb() -> None:
        release.set()
        order.append("alone")

    in_flight = runner.submit(batch)
    assert started.wait(30)
    lone_verb = runner.submit(alone_verb)
    assert in_flight.result(timeout=30) is False
    lone_verb.result(timeout=30)
    assert order == ["batch", "alone"]


def test_a_call_the_server_undid_to_end_a_deadlock_runs_again_and_succeeds(
    runner: Any,
) -> None:
    """Two calls each lock two workflows, in opposite orders, on two connections: the
    server ends the deadlock by undoing one (after ``deadlock_timeout``), which the store
    thread runs again, alone, once the other committed. Both callers get their answer,
    and the one undone wrote nothing the first time: each workflow has two signals."""
    store = runner.store
    for wid in ("x", "y"):
        runner.call_sync(store.create_workflow, new(wid), "ex-a", NOW + LEASE, NOW)
    both_hold_one = threading.Barrier(2, timeout=30)
    runs: list[str] = []

    def send_both(first: str, second: str) -> bool:
        runs.append(first)
        store.send_signal(first, "go", f'"{first}-first"', None, NOW)
        if runs.count(first) == 1:  # the first try only: each holds its first row
            both_hold_one.wait()
        return store.send_signal(second, "go", f'"{first}-then-{second}"', None, NOW)

    one = runner.submit(send_both, "x", "y")
    deadline = time.monotonic() + 30
    while not runs:  # running on one thread: the other call goes to another
        assert time.monotonic() < deadline
        time.sleep(0.001)
    other = runner.submit(send_both, "y", "x")
    assert one.result(timeout=60) is True and other.result(timeout=60) is True
    assert sorted(set(runs)) == ["x", "y"] and len(runs) >= 3, runs  # one ran again
    for wid in ("x", "y"):
        kept = runner.call_sync(store.list_signals, wid)
        assert len(kept) == 2, kept  # the undone try kept nothing


def test_a_batch_takes_its_workflows_rows_in_id_order(runner: Any) -> None:
    """The ops of one batch run ordered by the workflow each names (those naming none
    first, a start among them, each workflow's in the order made): two batches of the
    same workflows then never lock them in a cycle."""

    def verb(*args: Any) -> None:
        return None

    made = [base.Op(verb, (wid, n), True) for n, wid in enumerate(["b", "a", "c", "a"])]
    made.append(base.Op(verb, (runner.store, "b", 9), True))  # of operations: the store first
    made.append(base.Op(verb, (new("z"), "owner-0", 10), True))  # a start: first
    made.append(base.Op(verb, (["a", "b"], 11), True))  # names no one workflow: first
    ordered = base.lock_order(made)
    assert [op.args[-1] for op in ordered] == [10, 11, 1, 3, 0, 9, 2]  # b's two as made
