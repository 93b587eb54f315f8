"""The storage suite: the Store verbs, run on every backend through ``store_url``.

Every test talks to the Store interface only (``create_store`` and the verbs,
run inside ``run_batch`` as the store thread runs them); the few tests that
need a dialect's own kind of failure say so in their name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import durably
from durably import errors, journal
from durably.storage import base, create_store, thread
from durably.storage import sqlbase as sqlstore

NOW = 1_000_000.0
LEASE = 30.0
NEWEST = sqlstore.load_migrations()[-1][0]


class Verbs:
    """Calls a store's verbs as the store thread does: each in its own ``run_batch``."""

    def __init__(self, store: base.Store) -> None:
        self.store = store

    def run(self, fn: Any, *args: Any) -> Any:
        """Run any callable as one op of its own batch; raise its error."""
        op = base.Op(fn, args, write=True)
        self.store.run_batch([op])
        if op.error is not None:
            raise op.error
        return op.result

    def __getattr__(self, verb: str) -> Any:
        fn = getattr(self.store, verb)
        return lambda *args: self.run(fn, *args)


@pytest.fixture
def store(store_url: str) -> Iterator[base.Store]:
    s = create_store(store_url)
    s.open()
    yield s
    s.close()


@pytest.fixture
def db(store: base.Store) -> Verbs:
    return Verbs(store)


def new(wid: str = "wf-1", name: str = "refund", input: str = '{"args": [], "kwargs": {}}'):
    return base.NewWorkflow(wid, name, input, version=None, source_hash="abc")


def step(seq: int, status: str = "completed", *, name: str = "get", attempt: int = 1, payload="1"):
    return journal.Entry(seq, "step", name, status, attempt, payload, NOW, NOW + 1)


def executor(eid: str, started_at: float = NOW) -> journal.ExecutorInfo:
    return journal.ExecutorInfo(eid, "host-a", 4242, "start-token", started_at, started_at)


def owned(db: Verbs, wid: str = "wf-1", owner: str = "ex-a") -> journal.WorkflowInfo:
    info, created = db.create_workflow(new(wid), owner, NOW + LEASE, NOW)
    assert created
    return info


RUNNABLE = [("refund", None), ("triage", None)]


def claim_next(db: Verbs, owner: str, now: float = NOW, limit: int = 10, queues=()) -> list[str]:
    """The ids ``claim_next`` takes for ``owner`` at ``now``, in the order taken."""
    claimed = db.claim_next(owner, RUNNABLE, now + LEASE, now, limit, queues)
    assert all(w.owner == owner and w.status == "running" for w in claimed)
    return [w.workflow_id for w in claimed]


def take_over(db: Verbs, wid: str, owner: str, now: float = NOW + 2 * LEASE):
    """Claim ``wid`` for ``owner`` once its lease has run out (at ``now``)."""
    assert wid in claim_next(db, owner, now)
    return db.get_workflow(wid)


# --- schema ---------------------------------------------------------------------------


def test_migrate_again_is_a_no_op(store, db):
    assert store.migrate() == []
    assert store.migrate() == []
    assert db.schema_version() == NEWEST


def test_migrates_an_empty_database(empty_store_url):
    store = create_store(empty_store_url)
    store.open()
    try:
        assert Verbs(store).schema_version() == NEWEST
        assert store.migrate() == []
    finally:
        store.close()


def test_concurrent_migrators_apply_each_migration_once(empty_store_url):
    stores = [create_store(empty_store_url) for _ in range(3)]
    barrier = threading.Barrier(len(stores))
    failures: list[BaseException] = []

    def open_store(s: base.Store) -> None:
        barrier.wait()
        try:
            s.open()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_store, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert failures == []
        assert Verbs(stores[0]).schema_version() == NEWEST
        rows = sql_rows(empty_store_url, "SELECT version FROM durably_migrations")
        assert sorted(r[0] for r in rows) == [m[0] for m in sqlstore.load_migrations()]
    finally:
        for s in stores:
            s.close()


def test_schema_too_new_is_refused(store, store_url):
    sql_rows(
        store_url,
        f"INSERT INTO durably_migrations (version, name, applied_at) VALUES ({NEWEST + 1}, 'x', 0)",
    )
    with pytest.raises(errors.SchemaTooNew, match=f"schema version {NEWEST + 1}"):
        create_store(store_url).open()


def test_a_foreign_database_is_refused(empty_store_url):
    if empty_store_url.startswith("postgresql"):  # PostgreSQL: durably's schema, taken
        sql_rows(empty_store_url, "CREATE SCHEMA durably")
    sql_rows(empty_store_url, "CREATE TABLE customers (id BIGINT PRIMARY KEY)")
    with pytest.raises(errors.NotADurablyDatabase, match="customers"):
        create_store(empty_store_url).open()


# --- workflows --------------------------------------------------------------------------


def test_a_start_sent_twice_by_its_executor_at_one_time_is_created_once(db):
    """What a lost connection's second sending of a start looks like (PostgreSQL sends a
    start alone, committing before it answers): the same owner, the same time."""
    first, created = db.create_workflow(new(), "ex-a", NOW + LEASE, NOW)
    assert created
    again, created = db.create_workflow(new(), "ex-a", NOW + LEASE, NOW)
    assert created and again == first
    assert [c.reason for c in db.load_claims("wf-1")] == ["start"]
    _, created = db.create_workflow(new(), "ex-a", NOW + LEASE, NOW + 1)  # a later start
    assert not created


def test_create_workflow_is_idempotent_on_id(db):
    first, created = db.create_workflow(new(input='"first"'), "ex-a", NOW + LEASE, NOW)
    assert created
    assert (first.status, first.owner, first.epoch) == ("running", "ex-a", 1)
    again, created = db.create_workflow(new(input='"second"'), "ex-b", NOW + 99, NOW + 5)
    assert not created
    assert again == first
    assert again.input == '"first"'
    assert [(c.epoch, c.owner, c.reason) for c in db.load_claims("wf-1")] == [(1, "ex-a", "start")]


def test_create_workflow_without_owner_is_pending(db):
    info, created = db.create_workflow(new(), None, None, NOW)
    assert created
    assert (info.status, info.owner, info.epoch) == ("pending", None, 0)
    assert info.lease_expires_at is None
    assert db.load_claims("wf-1") == []


def test_get_and_list_workflows(db):
    assert db.get_workflow("nope") is None
    for i, name in enumerate(["refund", "refund", "triage", "refund"]):
        db.create_workflow(new(f"wf-{i}", name), None, None, NOW + i)
    assert claim_next(db, "ex-a", NOW, 2) == ["wf-0", "wf-1"]
    db.release("wf-0", 1, NOW)
    db.create_workflow(new("wf-0b", "refund"), None, None, NOW)  # not listed below

    def ids(status: str | None, name: str | None, limit: int = 10) -> list[str]:
        return [w.workflow_id for w in db.list_workflows(status, name, limit)]

    assert ids(None, None, 5) == ["wf-3", "wf-2", "wf-1", "wf-0", "wf-0b"]
    assert ids(None, "refund", 3) == ["wf-3", "wf-1", "wf-0"]
    assert ids("pending", None) == ["wf-3", "wf-2", "wf-0b"]
    assert ids("pending", "refund", 1) == ["wf-3"]
    assert ids("running", "triage") == []
    assert ids("running", None) == ["wf-1", "wf-0"]


# --- the journal ------------------------------------------------------------------------


def test_load_history_is_in_seq_order(db):
    info = owned(db)
    db.append_entries("wf-1", info.epoch, [step(3), step(1)], NOW)
    db.append_entries("wf-1", info.epoch, [step(2, payload='"two"')], NOW)
    history = db.load_history("wf-1")
    assert [e.seq for e in history] == [1, 2, 3]
    assert history[1] == step(2, payload='"two"')


def test_append_with_a_stale_epoch_is_fenced_and_writes_nothing(db):
    info = owned(db)
    taken = take_over(db, "wf-1", "ex-b")
    assert taken.epoch == info.epoch + 1
    with pytest.raises(durably.FencedError, match="ex-b"):
        db.append_entries("wf-1", info.epoch, [step(1)], NOW)
    assert db.load_history("wf-1") == []
    with pytest.raises(errors.WorkflowNotFound):
        db.append_entries("nope", 1, [step(1)], NOW)


def test_a_retrying_entry_is_replaced(db):
    info = owned(db)
    db.append_entries("wf-1", info.epoch, [step(1, "retrying", payload='"boom"')], NOW)
    final = step(1, "completed", attempt=2, payload='"ok"')
    db.append_entries("wf-1", info.epoch, [final], NOW)
    assert db.load_history("wf-1") == [final]


@pytest.mark.parametrize("final", ["completed", "failed"])
def test_a_final_entry_is_never_replaced(db, final):
    info = owned(db)
    kept = step(1, final, payload='"kept"')
    db.append_entries("wf-1", info.epoch, [kept], NOW)
    with pytest.raises(errors.StoreError, match="seq 1 already holds"):
        db.append_entries("wf-1", info.epoch, [step(1, "completed", payload='"other"')], NOW)
    assert db.load_history("wf-1") == [kept]


def test_an_entry_of_another_call_is_never_replaced(db):
    info = owned(db)
    kept = step(1, "retrying", name="get")
    db.append_entries("wf-1", info.epoch, [kept], NOW)
    with pytest.raises(errors.StoreError):
        db.append_entries("wf-1", info.epoch, [step(1, "completed", name="put")], NOW)
    other_kind = journal.Entry(1, "now", "get", "completed", 1, "1.5")
    with pytest.raises(errors.StoreError):
        db.append_entries("wf-1", info.epoch, [other_kind], NOW)
    assert db.load_history("wf-1") == [kept]


def test_finish_workflow_is_fenced(db):
    info = owned(db)
    take_over(db, "wf-1", "ex-b")
    with pytest.raises(durably.FencedError):
        db.finish_workflow("wf-1", info.epoch, "completed", '"zombie"', None, [step(1)], NOW)
    row = db.get_workflow("wf-1")
    assert (row.status, row.output, row.owner) == ("running", None, "ex-b")
    assert db.load_history("wf-1") == []

    db.finish_workflow("wf-1", row.epoch, "completed", '"done"', None, [step(1)], NOW + 1)
    row = db.get_workflow("wf-1")
    assert (row.status, row.output, row.owner, row.lease_expires_at) == (
        "completed", '"done"', None, None,
    )  # fmt: skip
    assert db.load_history("wf-1") == [step(1)]
    assert claim_next(db, "ex-b", NOW + 10 * LEASE) == []


# --- claims and leases --------------------------------------------------------------------


def test_claim_next_takes_unowned_expired_and_due_work_oldest_first(db):
    db.create_workflow(new("pending"), None, None, NOW)
    owned(db, "live")
    db.create_workflow(new("expired"), "ex-a", NOW - 1, NOW - 5)
    done = owned(db, "done")
    db.finish_workflow("done", done.epoch, "completed", "1", None, [], NOW)
    assert claim_next(db, "ex-b", NOW, limit=1) == ["expired"]
    assert claim_next(db, "ex-b", NOW) == ["pending"]
    assert claim_next(db, "ex-c", NOW) == []  # every lease is live
    assert claim_next(db, "ex-c", NOW + 2 * LEASE) == ["expired", "live", "pending"]


def test_claim_next_takes_only_what_runs_here(db):
    db.create_workflow(new("refund"), None, None, NOW)
    db.create_workflow(base.NewWorkflow("v2", "refund", "{}", "2", None), None, None, NOW)
    db.create_workflow(new("other", "unknown"), None, None, NOW)
    only_v2 = db.claim_next("ex-a", [("refund", "2")], NOW + LEASE, NOW, 10)
    assert [w.workflow_id for w in only_v2] == ["v2"]
    assert claim_next(db, "ex-a") == ["refund"]  # unversioned matches version None only
    assert db.get_workflow("other").status == "pending"


def test_claim_bumps_the_epoch_and_records_why(db):
    db.create_workflow(new("fresh"), None, None, NOW)
    (started,) = db.claim_next("ex-a", RUNNABLE, NOW + LEASE, NOW, 10)
    assert (started.owner, started.epoch, started.status, started.crash_count) == (
        "ex-a", 1, "running", 0,
    )  # fmt: skip

    (crashed,) = db.claim_next("ex-b", RUNNABLE, NOW + 2 * LEASE, NOW + LEASE + 1, 10)
    assert (crashed.owner, crashed.epoch, crashed.crash_count) == ("ex-b", 2, 1)
    assert crashed.lease_expires_at == NOW + 2 * LEASE

    db.release("fresh", crashed.epoch, NOW + 50)
    (resumed,) = db.claim_next("ex-c", RUNNABLE, NOW + 3 * LEASE, NOW + 60, 10)
    assert (resumed.owner, resumed.epoch, resumed.crash_count) == ("ex-c", 3, 1)

    claims = db.load_claims("fresh")
    assert [(c.epoch, c.owner, c.previous_owner, c.reason) for c in claims] == [
        (1, "ex-a", None, "start"),
        (2, "ex-b", "ex-a", "recovery"),
        (3, "ex-c", None, "resume"),
    ]
    assert claims[1].claimed_at == NOW + LEASE + 1


def test_progress_resets_the_crash_count(db):
    owned(db)
    info = take_over(db, "wf-1", "ex-b")
    assert info.crash_count == 1
    db.append_entries("wf-1", info.epoch, [step(1)], NOW)
    assert db.get_workflow("wf-1").crash_count == 0


def test_intents_and_pending_waits_are_not_progress(db):
    """A step that kills its executor after its intent keeps counting crashes in a row."""
    owned(db)
    info = take_over(db, "wf-1", "ex-b")
    db.append_entries("wf-1", info.epoch, [step(1, "started")], NOW)
    db.park("wf-1", info.epoch, "waiting", None, [step(2, "started", name="w")], [], [], NOW)
    assert db.get_workflow("wf-1").crash_count == 1
    info = db.claim_next("ex-c", RUNNABLE, NOW + 10 * LEASE, NOW + 5 * LEASE, 10)
    assert info == []  # parked and not due: nobody takes it
    row = db.get_workflow("wf-1")
    with pytest.raises(durably.FencedError):  # parked: nothing more is written at that epoch
        db.finish_workflow("wf-1", row.epoch, "completed", "1", None, [step(1)], NOW)


def test_racing_claimers_take_disjoint_work_without_waiting(store_url, db):
    """While one claimer holds its claim transaction open, another takes the rest at once."""
    for i in range(6):
        db.create_workflow(new(f"w{i}"), None, None, NOW + i)
    first, second = create_store(store_url), create_store(store_url)
    first.open()
    second.open()
    claimed = threading.Event()
    go_on = threading.Event()
    results: dict[str, Any] = {}

    def claim_and_hold() -> Any:
        rows = first.claim_next("ex-a", RUNNABLE, NOW + LEASE, NOW, 3)
        claimed.set()
        go_on.wait(10)
        return rows

    def run(name: str, s: base.Store, fn: Any, *args: Any) -> None:
        op = base.Op(fn, args, write=True)
        s.run_batch([op])
        results[name] = (op.error or op.result, time.monotonic())

    a = threading.Thread(target=run, args=("a", first, claim_and_hold))
    b = threading.Thread(
        target=run, args=("b", second, second.claim_next, "ex-b", RUNNABLE, NOW + LEASE, NOW, 10)
    )
    try:
        a.start()
        assert claimed.wait(10)
        b.start()
        b.join(5.0 if store_url.startswith("postgres") else 0.05)  # PG: b returns at once
        released_at = time.monotonic()
        go_on.set()
        a.join(10)
        b.join(10)
    finally:
        go_on.set()
        first.close()
        second.close()
    taken_a = [w.workflow_id for w in results["a"][0]]
    assert taken_a == ["w0", "w1", "w2"]
    taken_b = results["b"][0]
    if store_url.startswith("postgres"):
        # SKIP LOCKED: b neither waited for a nor took a's rows.
        assert results["b"][1] < released_at
        assert [w.workflow_id for w in taken_b] == ["w3", "w4", "w5"]
    else:
        # BEGIN IMMEDIATE: b waited for a's commit, then took what was left.
        assert [w.workflow_id for w in taken_b] == ["w3", "w4", "w5"]
    for i in range(6):
        assert len(db.load_claims(f"w{i}")) == 1


def queued(db: Verbs, wid: str, queue: str, now: float, **kw: Any) -> None:
    wf = base.NewWorkflow(wid, "refund", "{}", None, None, queue=queue, **kw)
    db.create_workflow(wf, None, None, now)


def test_queue_concurrency_counts_running_work_of_every_owner(db):
    for i in range(6):
        queued(db, f"q{i}", "llm", NOW + i)
    limits = base.QueueLimits("llm", concurrency=3, worker_concurrency=2)
    assert claim_next(db, "ex-a", NOW, queues=[limits]) == ["q0", "q1"]
    assert claim_next(db, "ex-b", NOW, queues=[limits]) == ["q2"]
    assert claim_next(db, "ex-c", NOW, queues=[limits]) == []
    assert claim_next(db, "ex-c", NOW) == []  # without the queue given, none of it
    db.finish_workflow("q0", 1, "completed", "1", None, [], NOW + 1)
    assert claim_next(db, "ex-c", NOW + 1, queues=[limits]) == ["q3"]
    # An expired lease holds no place: its workflow is claimed again within the limits.
    assert claim_next(db, "ex-d", NOW + 2 * LEASE, queues=[limits]) == ["q1", "q2"]


def test_queue_priority_then_age(db):
    queued(db, "low-old", "llm", NOW)
    queued(db, "high", "llm", NOW + 1, priority=5)
    queued(db, "low-new", "llm", NOW + 2)
    limits = base.QueueLimits("llm")
    assert claim_next(db, "ex-a", NOW + 3, limit=2, queues=[limits]) == ["high", "low-old"]


def test_queue_rate_limit_counts_first_claims_in_the_window(db):
    for i in range(5):
        queued(db, f"q{i}", "llm", NOW)
    limits = base.QueueLimits("llm", rate_limit=2, rate_per=10.0)
    assert claim_next(db, "ex-a", NOW, queues=[limits]) == ["q0", "q1"]
    assert claim_next(db, "ex-a", NOW + 5, queues=[limits]) == []
    # A recovery is not a start: q0 and q1 are claimed again, q2 waits for the window.
    assert claim_next(db, "ex-b", NOW + LEASE + 5, queues=[limits]) == ["q0", "q1", "q2", "q3"]


def test_a_deduplication_id_is_held_by_one_unfinished_workflow(db):
    queued(db, "first", "llm", NOW, deduplication_id="doc-7")
    wf = base.NewWorkflow("second", "refund", "{}", None, None, queue="llm",
                          deduplication_id="doc-7")  # fmt: skip
    info, created = db.create_workflow(wf, None, None, NOW)
    assert (info.workflow_id, created) == ("first", False)
    assert db.get_workflow("second") is None
    other_queue = dataclasses.replace(wf, workflow_id="elsewhere", queue="other")
    assert db.create_workflow(other_queue, None, None, NOW)[1]
    (taken,) = claim_next(db, "ex-a", queues=[base.QueueLimits("llm")])
    db.finish_workflow(taken, 1, "completed", "1", None, [], NOW)
    info, created = db.create_workflow(wf, None, None, NOW)
    assert (info.workflow_id, created, info.queue) == ("second", True, "llm")


def test_release_lets_go_only_at_the_owning_epoch(db):
    info = owned(db)
    db.release("wf-1", info.epoch + 7, NOW)
    assert db.get_workflow("wf-1").owner == "ex-a"
    db.release("wf-1", info.epoch, NOW)
    row = db.get_workflow("wf-1")
    assert (row.owner, row.lease_expires_at, row.epoch) == (None, None, info.epoch)
    assert claim_next(db, "ex-b") == ["wf-1"]


def test_release_of_a_run_that_died_counts_a_crash_once(db):
    info = owned(db)
    db.release("wf-1", info.epoch, NOW, True)
    row = db.get_workflow("wf-1")
    assert (row.owner, row.crash_count) == (None, info.crash_count + 1)
    assert claim_next(db, "ex-a") == ["wf-1"]  # a claim after a release adds no second crash
    assert db.get_workflow("wf-1").crash_count == info.crash_count + 1


def test_release_owned_lets_go_of_the_owners_workflows_only(db):
    owned(db, "a1", "ex-a")
    owned(db, "a2", "ex-a")
    owned(db, "b1", "ex-b")
    assert db.release_owned("ex-a", NOW) == 2
    assert db.release_owned("ex-a", NOW) == 0
    owners = {w.workflow_id: w.owner for w in db.list_workflows(None, None, 10)}
    assert owners == {"a1": None, "a2": None, "b1": "ex-b"}


def test_heartbeat_renews_only_the_owners_leases_and_names_them(db):
    db.register_executor(executor("ex-a"))
    db.register_executor(executor("ex-b"))
    owned(db, "a1", "ex-a")
    owned(db, "b1", "ex-b")
    assert db.heartbeat(executor("ex-a"), NOW + 20, NOW + 20 + LEASE) == [("a1", 1)]
    leases = {w.workflow_id: w.lease_expires_at for w in db.list_workflows(None, None, 10)}
    assert leases == {"a1": NOW + 20 + LEASE, "b1": NOW + LEASE}
    beats = {e.executor_id: e.heartbeat_at for e in db.list_executors()}
    assert beats == {"ex-a": NOW + 20, "ex-b": NOW}
    take_over(db, "a1", "ex-b", NOW + 20 + 2 * LEASE)
    assert db.heartbeat(executor("ex-a"), NOW + 21, NOW + 21 + LEASE) == []  # a1 is lost


def test_keep_leases_renews_only_what_the_owner_holds_at_that_epoch(db):
    db.register_executor(executor("ex-a"))
    for wid in ("held", "other-epoch", "taken", "finished", "released", "not-mine"):
        owned(db, wid, "ex-b" if wid == "not-mine" else "ex-a")
    db.release("taken", 1, NOW)
    assert claim_next(db, "ex-b", NOW + 1) == ["taken"]  # now at epoch 2, for ex-b
    db.finish_workflow("finished", 1, "completed", "1", None, [], NOW)
    db.release("released", 1, NOW)
    asked = [
        ("held", 1), ("other-epoch", 2), ("taken", 1), ("finished", 1),
        ("released", 1), ("not-mine", 1), ("missing", 1),
    ]  # fmt: skip
    assert db.keep_leases(executor("ex-a"), NOW + 20, NOW + 20 + LEASE, asked) == ["held"]
    leases = {w.workflow_id: w.lease_expires_at for w in db.list_workflows(None, None, 10)}
    assert leases == {
        "held": NOW + 20 + LEASE, "other-epoch": NOW + LEASE, "taken": NOW + 1 + LEASE,
        "finished": None, "released": None, "not-mine": NOW + LEASE,
    }  # fmt: skip
    beats = {e.executor_id: e.heartbeat_at for e in db.list_executors()}
    assert beats["ex-a"] == NOW + 20


def test_a_forgotten_executor_is_registered_again_by_its_heartbeat(db):
    db.register_executor(executor("ex-a"))
    db.remove_executor("ex-a", False)
    db.heartbeat(executor("ex-a"), NOW + 5, NOW + 5 + LEASE)
    assert [(e.executor_id, e.heartbeat_at) for e in db.list_executors()] == [("ex-a", NOW + 5)]


def test_executors_register_list_and_remove(db):
    db.register_executor(executor("ex-b", NOW + 1))
    db.register_executor(executor("ex-a", NOW))
    assert [e.executor_id for e in db.list_executors()] == ["ex-a", "ex-b"]
    db.register_executor(dataclasses.replace(executor("ex-a", NOW), heartbeat_at=NOW + 5))
    assert db.list_executors()[0] == journal.ExecutorInfo(  # a heartbeat refreshes the time
        "ex-a", "host-a", 4242, "start-token", NOW, NOW + 5
    )
    # the same id from another process (restarted under a fixed id): judged by that one
    again = journal.ExecutorInfo("ex-a", "other-host", 1, "x", NOW + 9, NOW + 9)
    db.register_executor(again)
    listed = db.list_executors()
    assert [e.executor_id for e in listed] == ["ex-b", "ex-a"]
    assert listed[1] == again

    owned(db, "a1", "ex-a")
    owned(db, "b1", "ex-b")
    db.remove_executor("ex-b", False)
    assert claim_next(db, "ex-c") == []  # b1's lease still runs
    db.remove_executor("ex-a", True)
    assert claim_next(db, "ex-c") == ["a1"]
    assert db.list_executors() == []


def test_a_repeated_commit_of_the_same_entries_is_accepted(db):
    """A commit whose outcome was lost with its connection is simply sent again."""
    info = owned(db)
    db.append_entries("wf-1", info.epoch, [step(1)], NOW)
    db.append_entries("wf-1", info.epoch, [step(1)], NOW + 1)  # the same receipt: fine
    wait = journal.Entry(2, "signal", "go", "started", 1, None, NOW, None, None)
    db.append_entries("wf-1", info.epoch, [wait], NOW)
    db.send_signal("wf-1", "go", '"one"', None, NOW)
    db.send_signal("wf-1", "go", '"two"', None, NOW)
    got = db.receive_signal("wf-1", info.epoch, wait, [], NOW)
    assert got.payload == '"one"'
    assert db.receive_signal("wf-1", info.epoch, wait, [], NOW) == got  # not '"two"'
    assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [2, None]


def test_a_race_gives_back_the_signal_its_losing_wait_took_once_and_fenced(db):
    """decide_race: the signal a losing wait took is the oldest of its name again and the
    loser's entry is gone; the commit sent again changes nothing; another epoch's is fenced."""
    info = owned(db)
    db.send_signal("wf-1", "go", '"one"', None, NOW)
    db.send_signal("wf-1", "go", '"two"', None, NOW)
    for seq, payload in ((1, '"one"'), (2, '"two"')):  # the winner's, then the loser's
        wait = journal.Entry(seq, "signal", "go", "started", 1, None, NOW)
        assert db.receive_signal("wf-1", info.epoch, wait, [], NOW).payload == payload
    race = journal.Entry(3, "wait", "wait_first", "completed", 1, '{"count":2,"done":[0]}', NOW)
    for _ in range(2):  # the second: a commit sent again, its outcome lost with its connection
        assert db.decide_race("wf-1", info.epoch, [race], [(2, "go")], NOW) is False
        assert [e.seq for e in db.load_history("wf-1")] == [1, 3]
        assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [1, None]
    later = journal.Entry(4, "signal", "go", "started", 1, None, NOW)
    assert db.receive_signal("wf-1", info.epoch, later, [], NOW).payload == '"two"'
    with pytest.raises(errors.FencedError):
        db.decide_race("wf-1", info.epoch - 1, [race], [(4, "go")], NOW)
    assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [1, 4]


# --- wake-ups ----------------------------------------------------------------------------------


def test_committed_changes_wake_listeners_and_rolled_back_ones_do_not(store_url, store, db):
    got: list[base.Wakeup] = []
    stop = store.listen(got.append)
    try:
        if store_url.startswith("sqlite"):
            db.create_workflow(new("x"), None, None, NOW)
            assert got == []  # SQLite engines poll
            return
        # once its LISTEN holds the listener reports "work" (what came before it is lost)
        assert _wait_until(lambda: base.Wakeup("work") in got, 5)
        got.clear()
        info = owned(db)
        db.create_workflow(new("pending"), None, None, NOW)
        db.send_signal("wf-1", "approval", "1", None, NOW)
        db.park("wf-1", info.epoch, "sleeping", NOW + 50, [], [], [], NOW)

        def signal_then_fail() -> None:
            store.send_signal("wf-1", "never", "1", None, NOW)
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            db.run(signal_then_fail)
        db.request_cancel("wf-1", NOW)
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
    finally:
        stop()
    assert got == [
        base.Wakeup("work"),
        base.Wakeup("signal", "wf-1", "approval"),
        base.Wakeup("timer", at=NOW + 50),
        base.Wakeup("cancel", "wf-1"),
    ]


# --- batches ------------------------------------------------------------------------------


def test_a_failing_op_does_not_undo_the_others_in_its_batch(store, db):
    a = owned(db, "a")
    b = owned(db, "b")
    db.release("b", b.epoch, NOW)
    take_over(db, "b", "ex-b", NOW)  # b's first run is now a zombie
    ops = [
        base.Op(store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
        base.Op(store.append_entries, ("b", b.epoch, [step(1)], NOW), True),
        base.Op(store.create_workflow, (new("c"), None, None, NOW), True),
        base.Op(store.get_workflow, ("a",), False),
    ]
    store.run_batch(ops)
    assert [type(op.error).__name__ for op in ops] == ["NoneType", "FencedError"] + ["NoneType"] * 2
    assert ops[2].result[1] is True
    assert ops[3].result.workflow_id == "a"
    assert db.load_history("a") == [step(1)]
    assert db.load_history("b") == []
    assert db.get_workflow("c") is not None


def claim_then_fail(store: base.Store, runnable: list[base.Runnable]) -> None:
    """An op that fills the runnable table (a claim of nothing), then fails: rolled back."""
    assert store.claim_next("ex-a", runnable, NOW + LEASE, NOW, 10) == []
    raise errors.StoreError("failed after filling the runnable table")


@pytest.mark.parametrize("alone", [True, False], ids=["rolled-back", "to-savepoint"])
def test_a_runnable_set_written_by_a_rolled_back_batch_is_written_again(store, db, alone):
    """The runnable table's rows roll back with the batch (whole, or the op's savepoint,
    when the batch runs again guarded): what it holds is not taken from the cache then."""
    assert claim_next(db, "ex-a") == []  # commits the table holding RUNNABLE
    ops = [base.Op(claim_then_fail, (store, [("other", None)]), True)]
    if not alone:
        ops.append(base.Op(store.get_workflow, ("a",), False))
    store.run_batch(ops)
    assert isinstance(ops[0].error, errors.StoreError)
    assert all(op.error is None for op in ops[1:])
    db.create_workflow(new("a"), None, None, NOW)
    db.create_workflow(new("o", "other"), None, None, NOW)
    # the table holds RUNNABLE again, not ("other", None): a cache that lied would find "a"
    taken = db.claim_next("ex-a", [("other", None)], NOW + LEASE, NOW, 10)
    assert [w.workflow_id for w in taken] == ["o"]
    assert claim_next(db, "ex-a") == ["a"]


def test_a_new_connection_has_its_runnable_table_written(store, db):
    """Closed and opened again: a new connection, no temporary table, whatever was known."""
    assert claim_next(db, "ex-a") == []
    store.close()
    store.open()
    db.create_workflow(new("a"), None, None, NOW)
    assert claim_next(db, "ex-a") == ["a"]


def test_the_store_thread_serves_concurrent_callers(store_url):
    runner = thread.StoreThread(create_store(store_url))
    runner.start()
    try:

        async def main() -> list[Any]:
            s = runner.store
            calls = [runner.call(s.create_workflow, new(f"w{i}"), "e", NOW, NOW) for i in range(20)]
            return await asyncio.gather(*calls)

        results = asyncio.run(main())
        assert all(created for _, created in results)
        assert len(runner.call_sync(runner.store.list_workflows, None, None, 100)) == 20
    finally:
        runner.stop()


# --- PostgreSQL: the connection ---------------------------------------------------------------


def test_postgres_parameters_are_rewritten_outside_literals_and_casts(pg_cluster):
    from durably.storage import postgres

    rewritten = postgres._paramstyle(
        "SELECT CAST(:a AS TEXT), x::text, '50% :b', 5 % 2 FROM t -- 10% :c\nWHERE y = :a"
    )
    assert rewritten == (
        "SELECT CAST(%(a)s AS TEXT), x::text, '50%% :b', 5 %% 2 FROM t -- 10%% :c\nWHERE y = %(a)s"
    )


def test_postgres_url_is_shown_without_its_password(pg_cluster):
    store = create_store(
        "postgres://app:pa55@db.internal:6432/orders?password=pa55&sslmode=require"
    )
    assert "pa55" not in store.url
    assert store.url == "postgres://app:***@db.internal:6432/orders?password=***&sslmode=require"
    with pytest.raises(errors.DurablyError, match="bad postgresql URL") as caught:
        create_store("postgresql://app:pa55@db.internal/orders?no_such_option=1")
    assert "pa55" not in str(caught.value)


def test_postgres_unreachable_names_the_database_not_the_password(pg_cluster):
    from tests import pgcluster

    url = f"postgresql://durably:s3cret-pw@127.0.0.1:{pgcluster.free_port()}/orders"
    store = create_store(url)
    assert "s3cret-pw" not in store.url
    with pytest.raises(errors.DatabaseUnavailable) as caught:
        store.open()
    message = str(caught.value)
    assert "s3cret-pw" not in message
    assert "'orders'" in message
    assert "127.0.0.1" in message


def test_postgres_store_survives_a_server_restart(pg_cluster, postgres_url):
    runner = thread.StoreThread(create_store(postgres_url))
    runner.start()
    s = runner.store
    try:
        runner.call_sync(s.create_workflow, new("before"), None, None, NOW)
        pg_cluster.restart()
        # The connection died while idle: the next batch reconnects before it begins.
        runner.call_sync(s.create_workflow, new("after"), None, None, NOW)
        ids = {w.workflow_id for w in runner.call_sync(s.list_workflows, None, None, 10)}
        assert ids == {"before", "after"}
    finally:
        runner.stop()


def test_postgres_batch_cut_by_a_restart_fails_and_the_next_reconnects(pg_cluster, postgres_url):
    store = create_store(postgres_url)
    store.open()
    db = Verbs(store)
    try:

        def write_then_lose_the_server() -> None:
            store.create_workflow(new("lost"), None, None, NOW)
            pg_cluster.restart()
            store.get_workflow("lost")

        with pytest.raises(errors.DatabaseUnavailable, match="next call reconnects"):
            db.run(write_then_lose_the_server)
        assert db.get_workflow("lost") is None  # rolled back with its connection
        batch = [
            base.Op(store.create_workflow, (new("x"), None, None, NOW), True),
            base.Op(write_then_lose_the_server, (), True),
        ]
        store.run_batch(batch)
        assert [type(op.error) for op in batch] == [errors.DatabaseUnavailable] * 2
        assert db.list_workflows(None, None, 10) == []
    finally:
        store.close()


def _wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def test_postgres_listener_hears_again_after_a_server_restart(pg_cluster, postgres_url):
    store = create_store(postgres_url)
    store.open()
    db = Verbs(store)
    got: list[base.Wakeup] = []
    stop = store.listen(got.append)

    def wait_for(wakeup: base.Wakeup) -> None:
        deadline = time.monotonic() + 15
        while wakeup not in got:
            assert time.monotonic() < deadline, got
            time.sleep(0.02)

    try:
        # LISTEN is issued by the listener's thread: signal until it has (no fixed sleep).
        # The probes are signals, so the only "work" heard after them is the reconnect's.
        db.create_workflow(new("before"), None, None, NOW)
        deadline = time.monotonic() + 15
        for n in itertools.count():
            probe = f"probe-{n}"
            db.send_signal("before", probe, "1", None, NOW)
            if _wait_until(lambda p=probe: base.Wakeup("signal", "before", p) in got, 0.5):
                break
            assert time.monotonic() < deadline, "the listener never heard a notification"
        got.clear()  # before the restart: the listener may reconnect before it returns
        pg_cluster.restart()
        wait_for(base.Wakeup("work"))  # reconnected: "you may have missed something"
        db.send_signal("before", "after-restart", "1", None, NOW)
        wait_for(base.Wakeup("signal", "before", "after-restart"))
    finally:
        stop()
        store.close()


# --- the engine on every backend ---------------------------------------------------------------


@durably.step
async def add_one(x: int) -> int:
    return x + 1


@durably.workflow(name="test_store.three_steps")
async def three_steps(x: int) -> int:
    return await add_one(await add_one(await add_one(x)))


def test_engine_runs_a_workflow_to_completion(store_url):
    async def main() -> tuple[Any, list[journal.Entry]]:
        async with durably.Engine(store_url, poll_interval=0.2) as engine:
            handle = await engine.start(three_steps, 1, workflow_id="smoke")
            result = await handle.result(timeout=20)
            return result, await engine.history("smoke")

    result, history = asyncio.run(main())
    assert result == 4
    assert [(e.seq, e.name, e.status, e.payload) for e in history] == [
        (1, "add_one", "completed", "2"),
        (2, "add_one", "completed", "3"),
        (3, "add_one", "completed", "4"),
    ]


# --- helpers that reach below the verbs (to set up a database the verbs would refuse) ----------


def sql_rows(url: str, statement: str) -> list[Any]:
    """Run one statement on its own driver connection, committed; return its rows."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            with conn:
                return conn.execute(statement).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("SET search_path TO durably")  # where durably's tables are
        cursor = pg.execute(statement)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def test_an_op_undone_by_a_conflict_runs_again_before_its_workflows_later_ops(store_url):
    """A batch's op that the database undid to end a deadlock runs again after the batch
    commits, and the batch's later ops of its workflow wait for it: the two signals
    keep the order they were sent in. (The op raises ``TransactionConflict`` itself, as
    a verb does when PostgreSQL undoes its transaction; the rest is the real store.)"""
    runner = thread.StoreThread(create_store(store_url))  # one thread: one batch at a time
    runner.start()
    s = runner.store
    try:
        runner.call_sync(s.create_workflow, new("w"), "e", NOW + LEASE, NOW)
        busy, release = threading.Event(), threading.Event()

        def hold_the_thread() -> None:
            busy.set()
            assert release.wait(30)

        tries: list[int] = []

        def send_first(store: Any, wid: str) -> bool:
            tries.append(len(tries))
            if len(tries) <= 2:  # the batch's first try, then its guarded one
                raise errors.TransactionConflict("deadlock detected (in this test)")
            return store.send_signal(wid, "go", '"first"', None, NOW)

        holding = runner.submit(hold_the_thread)
        assert busy.wait(30)
        first = runner.submit(send_first, s, "w")  # queued: one batch, once released
        second = runner.submit(s.send_signal, "w", "go", '"second"', None, NOW)
        release.set()
        holding.result(timeout=30)
        assert first.result(timeout=30) is True and second.result(timeout=30) is True
        assert len(tries) == 3
        sent = runner.call_sync(s.list_signals, "w")
        assert [(x["num"], x["payload"]) for x in sent] == [(1, '"first"'), (2, '"second"')]
    finally:
        runner.stop()


def test_an_end_that_closes_reviews_commits_with_them_or_not_at_all(db, store_url):
    """finish_closing_reviews is one transaction: while closing the review waits for a
    lock another transaction holds, nobody sees the workflow ended (PostgreSQL's usual end
    is one statement sent without BEGIN: it must not commit on its own here)."""
    info = owned(db)
    intent = journal.Entry(1, "step", "transfer", "started", 1, '{"args": []}', NOW)
    db.open_review("wf-1", info.epoch, intent, "wf-1:1", "outcome unknown", [intent], NOW)
    if not store_url.startswith("postgres"):  # one writer at a time: nobody sees between
        assert (
            db.finish_closing_reviews("wf-1", info.epoch, "failed", None, '"x"', [], NOW)[0]
            == "failed"
        )
        assert db.reviews(None) == []
        return
    import psycopg

    with psycopg.connect(store_url) as rival, psycopg.connect(store_url, autocommit=True) as look:
        for conn in (rival, look):
            conn.execute("SET search_path TO durably")
        rival.execute("SELECT * FROM reviews FOR UPDATE")  # holds the review's row
        ended: list[Any] = []
        closing = threading.Thread(
            target=lambda: ended.append(
                db.finish_closing_reviews("wf-1", info.epoch, "failed", None, '"x"', [], NOW)
            )
        )
        closing.start()
        time.sleep(1.0)
        seen = look.execute("SELECT status FROM workflows WHERE workflow_id = 'wf-1'").fetchone()
        rival.commit()
        closing.join(10)
    assert ended and ended[0][0] == "failed"
    assert seen == ("running",), seen
    assert db.reviews(None) == []
