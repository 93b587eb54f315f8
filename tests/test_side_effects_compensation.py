"""Compensation with a SIGKILL inside it: each undo happens once, newest first.

``checkout`` charges a card and holds a deposit, registering a refund for each
with ``durably.compensate``; shipping then fails. The compensations run as the
durable steps ``compensate:refund_deposit`` and ``compensate:refund_card``, each
a real refund on the payments service under its own idempotency key, so the
service's log shows how often each undo reached the outside.
"""

from __future__ import annotations

import json
from pathlib import Path

import durably
from tests.crashkit.refund_flows import CENTS, DEPOSIT
from tests.crashkit.refund_harness import CHECKOUT, CHECKOUT_AWAITING, Bench, bench

UNDO_DEPOSIT = "compensate:refund_deposit"
UNDO_CARD = "compensate:refund_card"


def assert_undone_once_newest_first(b: Bench) -> None:
    """One refund per compensation, deposit before card, each under its step's key."""
    refunds = b.refunds()
    assert [(r["order_id"], r["amount"]) for r in refunds] == [
        ("ORD-7-deposit", DEPOSIT),
        ("ORD-7-card", CENTS),
    ]
    assert [r["idempotency_key"] for r in refunds] == [b.key_of(UNDO_DEPOSIT), b.key_of(UNDO_CARD)]
    undo = [e for e in b.steps() if e.name.startswith("compensate:")]
    assert [(e.name, e.status) for e in undo] == [
        (UNDO_DEPOSIT, "completed"),
        (UNDO_CARD, "completed"),
    ]
    assert undo[0].seq < undo[1].seq


def test_a_kill_inside_a_compensation_still_undoes_everything_once(tmp_path: Path) -> None:
    with bench(tmp_path, "idempotent") as b:
        b.workflow_id = "checkout-ORD-7"
        killed = b.run(CHECKOUT, "ORD-7", crash=f"after_call:{UNDO_DEPOSIT}")
        assert killed.killed, killed.describe()
        assert [p["body"]["order_id"] for p in b.posts()] == ["ORD-7-deposit"]
        done = b.run(CHECKOUT, "ORD-7")
        assert done.returncode == 0, done.describe()

        assert_undone_once_newest_first(b)
        deposit_key, card_key = b.key_of(UNDO_DEPOSIT), b.key_of(UNDO_CARD)
        # the interrupted undo was sent again with its key; the service replayed it
        assert [p["idempotency_key"] for p in b.posts()] == [deposit_key, deposit_key, card_key]
        info = b.workflow()
        assert info.status == "failed"
        error = json.loads(info.error or "{}")
        assert error["type"] == "tests.crashkit.refund_flows.ShippingFailed"
        assert error["message"] == "carrier rejected ORD-7"
        assert b.step("ship").status == "failed"


def test_a_cancelled_workflow_runs_its_compensations(tmp_path: Path) -> None:
    with bench(tmp_path, "idempotent") as b:
        b.workflow_id = "checkout-ORD-7"
        waiting = b.run(CHECKOUT_AWAITING, "ORD-7", until=("waiting",))
        assert waiting.returncode == 0, waiting.describe()
        assert b.workflow().status == "waiting"
        assert b.posts() == []

        cancelled = b.cli("cancel", b.workflow_id)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        killed = b.run(CHECKOUT_AWAITING, "ORD-7", crash=f"after_call:{UNDO_CARD}")
        assert killed.killed, killed.describe()
        done = b.run(CHECKOUT_AWAITING, "ORD-7")
        assert done.returncode == 0, done.describe()

        assert_undone_once_newest_first(b)
        card_key = b.key_of(UNDO_CARD)
        assert [p["idempotency_key"] for p in b.posts()] == [
            b.key_of(UNDO_DEPOSIT),
            card_key,
            card_key,
        ]
        assert b.workflow().status == "cancelled"
        with durably.Client(b.url) as client:
            kinds = [e.kind for e in client.history(b.workflow_id)]
        assert "cancel" in kinds
