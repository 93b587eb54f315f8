"""Decisions taken at the same instant by two stores (two connections) on one database.

Each try starts both callers on a barrier, so they reach the database together;
exactly one of them may win, and what the journal says must agree with the
record of the decision. Both backends.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durably import errors, journal
from durably.storage import base, create_store
from tests.test_store import NOW, Verbs, owned

TRIES = 100


@pytest.fixture
def two(store_url: str) -> Iterator[tuple[Verbs, Verbs]]:
    """Two stores on one database, each with its own connection."""
    a, b = create_store(store_url), create_store(store_url)
    a.open()
    b.open()
    yield Verbs(a), Verbs(b)
    a.close()
    b.close()


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released together; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a racer is stuck"
    return results


def sql_rows(db: Verbs, statement: str) -> list[Any]:
    """The rows of a statement run in the store's own transaction (its schema, its dialect)."""
    return list(db.run(lambda: db.store._execute(statement).fetchall()))  # type: ignore[attr-defined]


def parked_for_review(db: Verbs, wid: str) -> None:
    """A workflow whose at-most-once step at seq 1 waits for a person."""
    info = owned(db, wid)
    intent = journal.Entry(1, "step", "charge", "started", 1, '{"args":[1]}', NOW)
    db.open_review(wid, info.epoch, intent, f"{wid}:1", "crashed mid-call", [intent], NOW)
    db.park(wid, info.epoch, "needs_review", None, [], [], [], NOW)


def test_two_resolvers_of_one_review_exactly_one_wins(two: tuple[Verbs, Verbs]) -> None:
    a, b = two
    for i in range(TRIES):
        wid = f"review-{i}"
        parked_for_review(a, wid)
        # Alternate which decision is which, and use identical decisions every third try.
        second = ("retry", None) if i % 3 == 0 else ("result", '"B"')
        got = at_once(
            functools.partial(a.resolve, wid, 1, "retry", None, "A", NOW + 1),
            functools.partial(b.resolve, wid, 1, *second, "B", NOW + 1),
        )
        winners = [r for r in got if isinstance(r, journal.Review)]
        losers = [r for r in got if not isinstance(r, journal.Review)]
        assert len(winners) == 1, f"try {i}: {got}"
        assert len(losers) == 1 and isinstance(losers[0], errors.NothingToResolve), got
        assert isinstance(losers[0], errors.AlreadyResolved), got
        won = winners[0]
        assert won.decided_by in str(losers[0])  # the loser is told who decided
        (entry,) = a.load_history(wid)
        status = {"retry": "retrying", "result": "completed"}[won.decision]
        assert entry.status == status, f"try {i}: journal {entry} but {won}"
        (row,) = sql_rows(
            a, f"SELECT decision, decided_by FROM reviews WHERE workflow_id = '{wid}'"
        )
        assert (row[0], row[1]) == (won.decision, won.decided_by), f"try {i}"
        assert a.get_workflow(wid).status == "pending"


def test_a_review_listed_before_its_run_parks_is_decided_only_after(
    two: tuple[Verbs, Verbs],
) -> None:
    """The queue lists a review from the moment its run opens it; a person deciding
    before that run parks is told to wait, and the run's park then finds it open."""
    a, b = two
    info = owned(a, "early")
    intent = journal.Entry(1, "step", "charge", "started", 1, '{"args":[1]}', NOW)
    a.open_review("early", info.epoch, intent, "early:1", "crashed mid-call", [intent], NOW)
    assert [r.seq for r in b.reviews("early")] == [1]
    with pytest.raises(errors.NothingToResolve) as refused:
        b.resolve("early", 1, "retry", None, "B", NOW + 1)
    assert not isinstance(refused.value, errors.AlreadyResolved)
    assert "is running" in str(refused.value) and "once the workflow parks" in str(refused.value)
    assert [r.decision for r in a.reviews("early")] == [None]  # still open, nothing written
    assert [e.status for e in a.load_history("early")] == ["started"]
    assert a.park("early", info.epoch, "needs_review", None, [], [], [], NOW)
    decided = b.resolve("early", 1, "retry", None, "B", NOW + 2)
    assert (decided.decision, decided.decided_by) == ("retry", "B")
    assert a.get_workflow("early").status == "pending"


def test_the_same_signal_key_at_the_same_moment_is_one_signal(two: tuple[Verbs, Verbs]) -> None:
    a, b = two
    for i in range(TRIES):
        wid = f"signal-{i}"
        owned(a, wid)
        got = at_once(
            functools.partial(a.send_signal, wid, "decision", '"yes"', "decision:1", NOW),
            functools.partial(b.send_signal, wid, "decision", '"no"', "decision:1", NOW),
        )
        assert sorted(got, key=str) == [False, True], f"try {i}: {got}"
        assert len(a.list_signals(wid)) == 1


def test_a_signal_to_a_finished_workflow_is_refused_and_not_kept(db: Verbs) -> None:
    info = owned(db, "done")
    db.finish_workflow("done", info.epoch, "completed", "1", None, [], NOW)
    with pytest.raises(errors.WorkflowFinished, match=r"'done' is completed"):
        db.send_signal("done", "go", "1", None, NOW)
    assert db.list_signals("done") == []
    # A resend of a signal delivered before the end is still just a duplicate.
    info = owned(db, "later")
    assert db.send_signal("later", "go", "1", "k", NOW) is True
    db.finish_workflow("later", info.epoch, "completed", "1", None, [], NOW)
    assert db.send_signal("later", "go", "1", "k", NOW) is False


@pytest.fixture
def db(store_url: str) -> Iterator[Verbs]:
    s: base.Store = create_store(store_url)
    s.open()
    yield Verbs(s)
    s.close()
