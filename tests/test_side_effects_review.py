"""Reconcile answers and the review queue, with real kills and the real payments service.

``refund_flow(..., "reconcile", mode)`` refunds through a step whose reconcile
function answers ``NotFound``, ``Unknown`` or raises (``mode``), so each test
exercises one branch of the unknown-outcome protocol after a SIGKILL between
the payments call and the step's receipt; a person then decides with
``Client.resolve``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import durably
from tests.crashkit.refund_harness import REFUND_FLOW, Bench, bench, payload

CRASH = "after_call:issue_refund"


def parked(b: Bench, mode: str) -> durably.Review:
    """Kill the reconcile flow after the call, recover it; it must wait for review."""
    assert b.run(REFUND_FLOW, "ORD-9912", "reconcile", mode, crash=CRASH).killed
    again = b.run(REFUND_FLOW, "ORD-9912", "reconcile", mode)
    assert again.returncode == 0, again.describe()
    assert b.workflow().status == "needs_review"
    (review,) = b.reviews()
    assert review.idempotency_key == b.key_of("issue_refund")
    assert len(b.posts()) == 1
    return review


def test_reconcile_not_found_runs_the_step_again_with_the_same_key(tmp_path: Path) -> None:
    with bench(tmp_path, "idempotent") as b:
        assert b.run(REFUND_FLOW, "ORD-9912", "reconcile", "notfound", crash=CRASH).killed
        done = b.run(REFUND_FLOW, "ORD-9912", "reconcile", "notfound")
        assert done.returncode == 0, done.describe()

        key = b.key_of("issue_refund")
        assert [p["idempotency_key"] for p in b.posts()] == [key, key]
        assert len(b.refunds()) == 1  # the service deduplicated the second request
        receipt = b.step("issue_refund")
        assert (receipt.status, receipt.attempt) == ("completed", 2)
        assert payload(receipt)["refund_id"] == b.refunds()[0]["refund_id"]
        assert b.workflow().status == "completed"
        assert b.reviews() == []


def test_reconcile_unknown_parks_and_resolve_retry_runs_again_with_the_same_key(
    tmp_path: Path,
) -> None:
    with bench(tmp_path, "idempotent") as b:
        review = parked(b, "unknown")
        assert review.reason == "reconcile answered durably.Unknown"
        with durably.Client(b.url) as client:
            decided = client.resolve(b.workflow_id, review.seq, retry=True, by="bob")
        assert (decided.decision, decided.decided_by) == ("retry", "bob")
        assert decided.decided_at is not None

        done = b.run(REFUND_FLOW, "ORD-9912", "reconcile", "unknown")
        assert done.returncode == 0, done.describe()
        key = review.idempotency_key
        assert [p["idempotency_key"] for p in b.posts()] == [key, key]
        assert len(b.refunds()) == 1
        assert b.workflow().status == "completed"
        assert b.step("issue_refund").attempt == 2


def test_reconcile_raising_parks_and_resolve_fail_reaches_the_workflow(tmp_path: Path) -> None:
    with bench(tmp_path, "lookup") as b:
        review = parked(b, "raise")
        assert review.reason == (
            "reconcile raised RuntimeError: the payments lookup endpoint is down"
        )
        with durably.Client(b.url) as client:
            client.resolve(b.workflow_id, review.seq, fail="finance will check", by="carol")

        done = b.run(REFUND_FLOW, "ORD-9912", "reconcile", "raise")
        assert done.returncode == 0, done.describe()
        info = b.workflow()
        assert info.status == "completed"  # the workflow caught ResolvedAsFailed
        result = payload_of(info.output)
        assert result["refund_id"] is None
        assert "resolved as failed by carol: finance will check" in str(result["failed"])
        failed = b.step("issue_refund")
        assert failed.status == "failed"
        assert payload(failed)["type"] == "durably.errors.ResolvedAsFailed"
        assert len(b.posts()) == 1  # a failed resolution never calls the service


def test_resolve_result_is_the_receipt_and_decides_once(tmp_path: Path) -> None:
    with bench(tmp_path, "lookup") as b:
        review = parked(b, "unknown")
        (post,) = b.posts()
        with durably.Client(b.url) as client:
            client.resolve(
                b.workflow_id, review.seq, result={"refund_id": post["refund_id"]}, by="dan"
            )
            try:
                client.resolve(b.workflow_id, review.seq, retry=True, by="eve")
            except durably.NothingToResolve as exc:
                assert "decided already" in str(exc)
            else:
                raise AssertionError("a second decision was accepted")
        done = b.run(REFUND_FLOW, "ORD-9912", "reconcile", "unknown")
        assert done.returncode == 0, done.describe()
        assert payload(b.step("issue_refund")) == {"refund_id": post["refund_id"]}
        assert payload_of(b.workflow().output)["refund_id"] == post["refund_id"]
        assert len(b.posts()) == 1
        (decided,) = b.decided_reviews()
        assert decided["decided_by"] == "dan"


def test_cancelling_a_workflow_that_waits_for_review_cancels_it(tmp_path: Path) -> None:
    """``cancel`` of a needs_review workflow ends it, and closes its review as cancelled."""
    with bench(tmp_path, "plain") as b:
        parked_at_most_once(b)
        with durably.Client(b.url) as client:
            assert client.cancel(b.workflow_id) == [b.workflow_id]
        b.run(REFUND_FLOW, "ORD-9912", "at_most_once", until=(), child_timeout=5.0)
        assert b.workflow().status == "cancelled"
        assert len(b.posts()) == 1
        assert b.reviews() == []  # nothing left to decide
        with durably.Client(b.url) as client, pytest.raises(durably.NothingToResolve):
            client.resolve(b.workflow_id, 1, retry=True, by="late")


def parked_at_most_once(b: Bench) -> durably.Review:
    assert b.run(REFUND_FLOW, "ORD-9912", "at_most_once", crash=CRASH).killed
    again = b.run(REFUND_FLOW, "ORD-9912", "at_most_once")
    assert again.returncode == 0, again.describe()
    assert b.workflow().status == "needs_review"
    (review,) = b.reviews()
    assert review.idempotency_key == b.key_of("issue_refund")
    return review


def payload_of(output: str | None) -> dict[str, object]:
    import json

    value = json.loads(output or "null")
    assert isinstance(value, dict), output
    return value


def test_resuming_a_cancelled_review_asks_again_instead_of_running_the_step(
    tmp_path: Path,
) -> None:
    """A needs_review workflow cancelled, then resumed: the at-most-once step's outcome is
    still unknown, so it parks for review again; it never reaches the service a second time."""
    with bench(tmp_path, "plain") as b:
        parked_at_most_once(b)
        with durably.Client(b.url) as client:
            client.cancel(b.workflow_id)
        b.run(REFUND_FLOW, "ORD-9912", "at_most_once", until=(), child_timeout=5.0)
        assert b.workflow().status == "cancelled"
        with durably.Client(b.url) as client:
            client.resume(b.workflow_id)
        again = b.run(REFUND_FLOW, "ORD-9912", "at_most_once", child_timeout=10.0)
        assert again.returncode == 0, again.describe()
        assert len(b.posts()) == 1, b.posts()  # the unknown transfer was not made again
        assert b.workflow().status == "needs_review"
        (review,) = b.reviews()
        assert review.idempotency_key == b.key_of("issue_refund")
