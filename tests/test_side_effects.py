"""The refund that must not happen twice (seed 003), under each side-effect policy.

Every test kills a real child process with SIGKILL between the payments call and
the step's return (``DURABLY_CRASH_AT=after_call:issue_refund``), recovers it in
a new process on the same SQLite file, and counts what the real HTTP payments
service logged: requests, keys and refunds. Durably's own logs are not trusted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from durably.testing import payments
from tests import children
from tests.crashkit.refund_flows import CENTS, PAYMENTS_ENV
from tests.crashkit.refund_harness import REFUND_FLOW, bench, payload

CRASH = "after_call:issue_refund"


def test_plain_step_sends_the_same_key_twice_and_the_service_refunds_once(
    tmp_path: Path,
) -> None:
    with bench(tmp_path, "idempotent") as b:
        killed = b.run(REFUND_FLOW, "ORD-9912", "plain", crash=CRASH)
        assert killed.killed, killed.describe()
        assert b.marker.read_text().strip() == CRASH
        assert len(b.posts()) == 1  # the refund happened before the kill
        done = b.run(REFUND_FLOW, "ORD-9912", "plain")
        assert done.returncode == 0, done.describe()

        key = b.key_of("issue_refund")
        posts = b.posts()
        assert [p["idempotency_key"] for p in posts] == [key, key]
        assert [p["created"] for p in posts] == [True, False]  # the second one was replayed
        refunds = b.refunds()
        assert len(refunds) == 1
        info = b.workflow()
        assert info.status == "completed"
        assert payload(b.step("issue_refund"))["refund_id"] == refunds[0]["refund_id"]
        assert b.step("issue_refund").attempt == 1  # a plain step keeps no intent: no attempt 2


def test_reconcile_finds_the_refund_instead_of_calling_again(tmp_path: Path) -> None:
    with bench(tmp_path, "lookup") as b:
        assert b.run(REFUND_FLOW, "ORD-9912", "reconcile", crash=CRASH).killed
        done = b.run(REFUND_FLOW, "ORD-9912", "reconcile")
        assert done.returncode == 0, done.describe()

        key = b.key_of("issue_refund")
        assert [p["idempotency_key"] for p in b.posts()] == [key]  # exactly one request
        asked = [parse_qs(urlsplit(g["path"]).query)["idempotency_key"] for g in b.lookups()]
        assert asked == [[key]]  # reconcile asked the service once, by the step's key
        (original,) = b.refunds()
        receipt = b.step("issue_refund")
        assert receipt.status == "completed"
        assert payload(receipt) == original  # the journal's receipt is the original refund
        info = b.workflow()
        assert info.status == "completed"
        result = payload_of_output(info.output)
        assert result["refund"] == original
        assert result["refund_id"] == original["refund_id"]


def test_at_most_once_parks_for_review_and_a_person_decides_once(tmp_path: Path) -> None:
    with bench(tmp_path, "plain") as b:
        assert b.run(REFUND_FLOW, "ORD-9912", "at_most_once", crash=CRASH).killed
        parked = b.run(REFUND_FLOW, "ORD-9912", "at_most_once")
        assert parked.returncode == 0, parked.describe()
        assert b.workflow().status == "needs_review"
        assert len(b.posts()) == 1  # not repeated automatically
        (review,) = b.reviews()
        key = b.key_of("issue_refund")
        assert (review.seq, review.step, review.idempotency_key) == (
            b.step("issue_refund").seq,
            "issue_refund",
            key,
        )

        listed = b.cli("review", "list")
        assert listed.returncode == 0, listed.stderr
        assert b.workflow_id in listed.stdout
        assert key in listed.stdout
        assert '"ORD-9912"' in listed.stdout and str(CENTS) in listed.stdout  # its arguments
        assert "at-most-once" in listed.stdout

        (post,) = b.posts()
        refund_id = post["refund_id"]
        before = time.time()
        resolved = b.cli(
            "review",
            "resolve",
            b.workflow_id,
            str(review.seq),
            "--result",
            f'{{"refund_id": "{refund_id}"}}',
            "--by",
            "alice",
        )
        after = time.time()
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr
        assert "result by alice" in resolved.stdout

        again = b.cli("review", "resolve", b.workflow_id, str(review.seq), "--retry")
        assert again.returncode != 0
        assert "decided already" in again.stdout + again.stderr
        assert b.reviews() == []
        (decided,) = b.decided_reviews()
        assert decided["decision"] == "result"
        assert decided["decided_by"] == "alice"
        assert before <= decided["decided_at"] <= after

        done = b.run(REFUND_FLOW, "ORD-9912", "at_most_once")
        assert done.returncode == 0, done.describe()
        info = b.workflow()
        assert info.status == "completed"
        assert payload_of_output(info.output)["refund_id"] == refund_id
        assert len(b.posts()) == 1  # completing did not call the service again
        assert len(b.refunds()) == 1
        late = b.cli("review", "resolve", b.workflow_id, str(review.seq), "--fail", "too late")
        assert late.returncode != 0
        assert "no step awaiting a decision" in late.stdout + late.stderr


def test_intent_boundaries_can_be_crashed_through_the_environment(tmp_path: Path) -> None:
    """DURABLY_CRASH_AT=after_intent:STEP is documented in durably.faults; it must work.

    Fails today: ``faults.POINTS`` lacks ``before_intent`` and ``after_intent``,
    so ``import durably`` raises ValueError under this environment. Fix: add
    both names to ``POINTS`` in src/durably/faults.py.
    """
    with bench(tmp_path, "plain") as b:
        script = (
            "import sys, durably\n"
            "from tests.crashkit import refund_flows\n"
            "durably.run(refund_flows.refund_flow, 'ORD-9912', 'at_most_once',\n"
            "            workflow_id=sys.argv[1], database=sys.argv[2])\n"
        )
        env = children.child_env(
            {
                "DURABLY_CRASH_AT": "after_intent:issue_refund",
                "DURABLY_CRASH_ONCE": str(b.marker),
                PAYMENTS_ENV: b.server.url,
            }
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, b.workflow_id, b.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == -9, proc.stderr[-2000:]
        assert b.posts() == []  # killed after the intent, before the call
        parked = b.run(REFUND_FLOW, "ORD-9912", "at_most_once")
        assert parked.returncode == 0, parked.describe()
        assert b.workflow().status == "needs_review"
        assert payments.read_log(b.server.log_path) == []


def payload_of_output(output: str | None) -> dict[str, object]:
    import json

    value = json.loads(output or "null")
    assert isinstance(value, dict), output
    return value
