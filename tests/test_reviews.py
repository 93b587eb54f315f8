"""Unknown outcomes in one process: an engine stopped hard leaves an intent without receipt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import faults

LOG: list[tuple[str, Any]] = []
GATE: dict[str, asyncio.Event] = {}
VERDICT: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()
    GATE.clear()
    VERDICT.clear()


def find(key: str, order: str) -> Any:
    LOG.append(("reconcile", key))
    verdict = VERDICT["answer"]
    if isinstance(verdict, Exception):
        raise verdict
    return verdict


@durably.step(reconcile=find)
async def refund(order: str) -> dict[str, str]:
    LOG.append(("refund", durably.idempotency_key()))
    if "hang" in GATE:
        await GATE["hang"].wait()
    return {"refund_id": f"re-{order}"}


@durably.step(at_most_once=True)
async def transfer(order: str) -> dict[str, str]:
    LOG.append(("transfer", durably.idempotency_key()))
    if "hang" in GATE:
        await GATE["hang"].wait()
    return {"transfer_id": f"tr-{order}"}


@durably.step(reconcile=find, retry=durably.Retry(max_attempts=5, initial=0.01))
async def refund_retried(order: str) -> dict[str, str]:
    LOG.append(("refund_retried", durably.idempotency_key()))
    if "hang" in GATE:
        await GATE["hang"].wait()
    return {"refund_id": f"re-{order}"}


@durably.workflow
async def pay(order: str, kind: str) -> Any:
    if kind == "reconcile":
        return await refund(order)
    if kind == "reconcile-retried":
        try:
            return await refund_retried(order)
        except durably.EncodeError as exc:
            return f"not stored: {exc}"
    try:
        return await transfer(order)
    except durably.ResolvedAsFailed as exc:
        return f"gave up: {exc}"


async def until_status(handle: durably.WorkflowHandle, status: str, timeout: float = 10.0) -> None:
    """Wait until the workflow's status is ``status``; fail, naming the last one seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (now := await handle.status()) != status:
        assert loop.time() < deadline, f"{handle.workflow_id} still {now}, not {status}"
        await asyncio.sleep(0.02)


async def interrupt(url: str, kind: str, wid: str) -> None:
    """Start the workflow and stop the engine hard while the step hangs: intent, no receipt."""
    await stop_in_step(url, wid, pay, "ORD-1", kind)
    history = durably.Client(url).history(wid)
    assert [(e.name, e.status) for e in history] == [(history[0].name, "started")]


async def test_reconcile_found_records_the_original_receipt(sqlite_url: str) -> None:
    await interrupt(sqlite_url, "reconcile", "r1")
    VERDICT["answer"] = durably.Found({"refund_id": "re-original"})
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        assert await e.handle("r1").result(timeout=5) == {"refund_id": "re-original"}
    assert LOG == [("refund", "r1:1"), ("reconcile", "r1:1")]


class Unstorable:
    """A result no payload can hold (not JSON, not a dataclass or model)."""


async def test_a_reconciled_result_that_cannot_be_stored_fails_the_attempt_on_record(
    store_url: str,
) -> None:
    """reconcile found the call happened, but its result cannot be encoded: the
    attempt is recorded as failed, naming the step, workflow and seq, as a result the
    step itself returned would be; never run again (it happened), its retry policy
    notwithstanding, and never asked again on a replay."""
    await interrupt(store_url, "reconcile-retried", "r5")
    VERDICT["answer"] = durably.Found(Unstorable())
    where = "step 'refund_retried' (workflow 'r5', seq 1) reconciled result"
    async with durably.Engine(store_url, poll_interval=0.1) as e:
        said = await e.handle("r5").result(timeout=5)
        (entry,) = await e.history("r5")
    assert (entry.status, entry.attempt) == ("failed", 1), entry  # not an open intent
    assert said.startswith("not stored: ") and where in said, said
    assert "Unstorable" in said and "happened, so it is not run again" in said, said
    recorded = json.loads(entry.payload or "{}")
    assert recorded["type"] == "durably.errors.EncodeError", recorded
    assert where in recorded["message"], recorded
    assert LOG == [("refund_retried", "r5:1"), ("reconcile", "r5:1")]
    async with durably.Engine(store_url, poll_interval=0.1) as e:  # a replay of seq 1
        fork = await e.fork("r5", from_seq=1)
        assert (await fork.result(timeout=5)).startswith("not stored: cannot encode step")
    assert LOG == [("refund_retried", "r5:1"), ("reconcile", "r5:1")]  # nothing asked again


async def test_reconcile_not_found_runs_again_with_the_same_key(sqlite_url: str) -> None:
    await interrupt(sqlite_url, "reconcile", "r2")
    VERDICT["answer"] = durably.NotFound
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        assert await e.handle("r2").result(timeout=5) == {"refund_id": "re-ORD-1"}
        (entry,) = await e.history("r2")
    assert LOG == [("refund", "r2:1"), ("reconcile", "r2:1"), ("refund", "r2:1")]
    assert entry.attempt == 2


@pytest.mark.parametrize("answer", [durably.Unknown, RuntimeError("lookup down")])
async def test_reconcile_that_cannot_tell_parks_for_review(sqlite_url: str, answer: Any) -> None:
    await interrupt(sqlite_url, "reconcile", "r3")
    VERDICT["answer"] = answer
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        await until_status(e.handle("r3"), "needs_review")
        (review,) = await e.reviews()
        assert (review.workflow_id, review.seq, review.step) == ("r3", 1, "refund")
        assert review.idempotency_key == "r3:1" and "ORD-1" in (review.intent or "")
        assert ("Unknown" if answer is durably.Unknown else "lookup down") in review.reason
        await e.resolve("r3", 1, retry=True, by="alice")
        assert await e.handle("r3").result(timeout=5) == {"refund_id": "re-ORD-1"}
    assert [x for x in LOG if x[0] == "refund"] == [("refund", "r3:1"), ("refund", "r3:1")]


async def stop_in_step(url: str, wid: str, workflow: Any, *args: Any) -> None:
    """Start ``workflow`` and stop the engine hard while its first step hangs."""
    GATE["hang"] = asyncio.Event()
    engine = durably.Engine(url, hold_seconds=0.05, poll_interval=0.1)
    await engine.open()
    await engine.start(workflow, *args, workflow_id=wid)
    deadline = asyncio.get_running_loop().time() + 10.0
    while not LOG:
        assert asyncio.get_running_loop().time() < deadline, "the step did not start in 10 s"
        await asyncio.sleep(0.01)
    await engine.close(drain_timeout=0.05)
    del GATE["hang"]


async def test_at_most_once_parks_and_a_person_decides_once(sqlite_url: str) -> None:
    await interrupt(sqlite_url, "at_most_once", "t1")
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        await until_status(e.handle("t1"), "needs_review")
        assert [r.step for r in await e.reviews()] == ["transfer"]
        decided = await e.resolve("t1", 1, result={"transfer_id": "tr-seen"}, by="bob")
        assert (decided.decision, decided.decided_by) == ("result", "bob")
        with pytest.raises(durably.NothingToResolve):
            await e.resolve("t1", 1, retry=True, by="carol")
        assert await e.handle("t1").result(timeout=5) == {"transfer_id": "tr-seen"}
        assert await e.reviews() == []
    assert [x[0] for x in LOG] == ["transfer"]  # never repeated


async def test_resolved_as_failed_reaches_the_workflow(sqlite_url: str) -> None:
    await interrupt(sqlite_url, "at_most_once", "t2")
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        await until_status(e.handle("t2"), "needs_review")
        await e.resolve("t2", 1, fail="bank says no", by="dan")
        result = await e.handle("t2").result(timeout=5)
    assert result == "gave up: resolved as failed by dan: bank says no"


async def test_a_review_cancelled_then_resumed_is_asked_again(store_url: str) -> None:
    """Cancel a workflow parked for review, resume it: its at-most-once step's outcome is
    still unknown, so it parks for review again (the same review, reopened), never runs."""
    await interrupt(store_url, "at_most_once", "t3")
    async with durably.Engine(store_url, poll_interval=0.1) as e:
        await until_status(e.handle("t3"), "needs_review")
        await e.cancel("t3")
        await until_status(e.handle("t3"), "cancelled")
        assert await e.reviews() == []
        await e.resume("t3")
        await until_status(e.handle("t3"), "needs_review")
        (review,) = await e.reviews()
        assert (review.seq, review.step, review.idempotency_key) == (1, "transfer", "t3:1")
        await e.resolve("t3", 1, result={"transfer_id": "tr-seen"}, by="bob")
        assert await e.handle("t3").result(timeout=5) == {"transfer_id": "tr-seen"}
    assert [x[0] for x in LOG] == ["transfer"]  # never repeated


async def test_a_cancel_that_finds_an_unknown_outcome_keeps_it_for_review(
    store_url: str,
) -> None:
    """A cancel asked while an at-most-once step's outcome is unknown (its run gone) is
    delivered once the step awaits review, not over its intent: resumed, it asks again."""
    await interrupt(store_url, "at_most_once", "t4")
    with durably.Client(store_url) as client:
        assert client.cancel("t4") == ["t4"]
    async with durably.Engine(store_url, poll_interval=0.1) as e:
        await until_status(e.handle("t4"), "cancelled")
        await e.resume("t4")
        await until_status(e.handle("t4"), "needs_review")
        (review,) = await e.reviews()
        assert (review.seq, review.idempotency_key) == (1, "t4:1")
    assert [x[0] for x in LOG] == ["transfer"]  # never repeated


@durably.step
async def book(item: str) -> str:
    LOG.append(("book", item))
    return item


@durably.step
async def unbook(item: str) -> None:
    LOG.append(("unbook", item))


@durably.step
async def charge() -> None:
    LOG.append(("charge", None))
    raise ValueError("card declined")


@durably.workflow
async def trip() -> None:
    for item in ("flight", "hotel"):
        await book(item)
        durably.compensate(unbook, item)
    await charge()


async def test_compensations_run_newest_first_then_the_workflow_fails(sqlite_url: str) -> None:
    async with durably.Engine(sqlite_url) as e:
        with pytest.raises(ValueError, match="card declined"):
            await (await e.start(trip, workflow_id="trip")).result(timeout=5)
        names = [x.name for x in await e.history("trip")]
    assert LOG == [
        ("book", "flight"),
        ("book", "hotel"),
        ("charge", None),
        ("unbook", "hotel"),
        ("unbook", "flight"),
    ]
    assert names[-2:] == ["compensate:unbook", "compensate:unbook"]


@durably.workflow
async def transfer_and_fail(order: str) -> Any:
    async def other_branch() -> None:
        await durably.sleep(0.3)
        raise RuntimeError("the other branch failed")

    return await asyncio.gather(transfer(order), other_branch())


async def test_a_workflow_that_ends_closes_the_reviews_it_left_open(sqlite_url: str) -> None:
    """A branch's step awaits a person when another branch fails the workflow: the review
    must leave the queue (nobody could decide it: the workflow has ended), and come back
    if the workflow is resumed."""
    await stop_in_step(sqlite_url, "t-ends", transfer_and_fail, "ORD-1")  # outcome unknown
    async with durably.Engine(sqlite_url, poll_interval=0.1) as e:
        with pytest.raises(RuntimeError, match="other branch failed"):
            await e.handle("t-ends").result(timeout=10)
        assert await e.reviews() == []
        await e.resume("t-ends")
        await until_status(e.handle("t-ends"), "failed")
        assert [r.step for r in await e.reviews()] == []  # ended again, closed again
    assert [x[0] for x in LOG] == ["transfer"]  # never repeated


class ReviewsAtTheEnd:
    """A fault observer that reads, the moment a workflow's final status is committed
    (``after_finish``), the reviews its database still holds open, on a connection of its
    own: what a crash at that moment would leave."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.seen: list[list[str]] = []

    def reached(self, point: str, step: str) -> None:
        if point == "after_finish":
            with contextlib.closing(sqlite3.connect(self.db)) as conn:
                rows = conn.execute("SELECT step FROM reviews WHERE decision IS NULL")
                self.seen.append([str(r[0]) for r in rows])

    def step_called(self, step: Any, ctx: Any) -> None:
        pass

    def committed(self, workflow_id: str, entries: Any) -> None:
        pass


async def test_a_workflow_ends_and_closes_its_reviews_in_one_transaction(
    tmp_path: Path,
) -> None:
    """The end that closes a branch's review commits with the final status: never a
    `failed` workflow whose review still waits for a person (a crash right after the
    final commit left it there for good, and a reader could see both)."""
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    await stop_in_step(url, "t-once", transfer_and_fail, "ORD-2")
    observer = ReviewsAtTheEnd(tmp_path / "durably.db")
    faults.observe(observer)
    try:
        async with durably.Engine(url, poll_interval=0.1) as e:
            with pytest.raises(RuntimeError, match="other branch failed"):
                await e.handle("t-once").result(timeout=10)
    finally:
        faults.observe(None)
    assert observer.seen == [[]]


@durably.step
async def after_go(payload: str) -> str:
    LOG.append(("after_go", payload))
    return payload


@durably.workflow
async def transfer_and_listen(order: str) -> Any:
    async def listen() -> str:
        return await after_go(str(await durably.wait_for_signal("go")))

    return await asyncio.gather(transfer(order), listen())


async def test_a_signal_reaches_a_branch_while_another_awaits_review(store_url: str) -> None:
    """One branch's step awaits a person; another branch waits for a signal. The signal
    must wake the workflow (parked as needs_review) so that branch goes on, not wait for
    the review to be decided (hours, maybe)."""
    await stop_in_step(store_url, "t-listen", transfer_and_listen, "ORD-1")  # outcome unknown
    async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=30) as e:
        await until_status(e.handle("t-listen"), "needs_review")
        await e.send_signal("t-listen", "go", "now")
        deadline = asyncio.get_running_loop().time() + 5
        while ("after_go", "now") not in LOG:
            assert asyncio.get_running_loop().time() < deadline, "the branch never heard it"
            await asyncio.sleep(0.02)
        await until_status(e.handle("t-listen"), "needs_review")  # the review still waits
        await e.resolve("t-listen", 1, result={"transfer_id": "tr-seen"}, by="bob")
        assert await e.handle("t-listen").result(timeout=10) == [{"transfer_id": "tr-seen"}, "now"]
    assert [x[0] for x in LOG].count("transfer") == 1
