"""Waiting across real processes: timers, signals, children, cancel, resume, fork, workers.

Every test runs workflows of ``tests/crashkit/waiting_flows.py`` in child
processes on a real SQLite file, SIGKILLs them from here at chosen moments,
drives them with the ``durably`` command line from other processes, and counts
what really ran in the effects file (one line per step invocation) and what
was committed in the database file, never in logs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from tests.crashkit.waiting_harness import FLOWS, Kit


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[Kit]:
    k = Kit(tmp_path)
    try:
        yield k
    finally:
        k.close()


def rows_of(kit: Kit, workflow_id: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in kit.journal(workflow_id) if r["kind"] == kind]


def signals(kit: Kit, workflow_id: str) -> list[dict[str, Any]]:
    with durably.Client(kit.url) as client:
        return client.signals(workflow_id)


# --- a durable timer ---------------------------------------------------------------------


@pytest.mark.parametrize("held", [False, True], ids=["parked", "held-in-memory"])
def test_kill_during_a_sleep_waits_only_what_was_left(kit: Kit, held: bool) -> None:
    # hold 0.1 s: the run parks (status sleeping, no owner) long before the kill;
    # hold 10 s: the 3 s sleep stays in memory (status running) until the kill
    hold = 10.0 if held else 0.1
    first = kit.runner("wc_nap", "nap", [3], hold=hold)
    sleep = kit.wait_until(lambda: rows_of(kit, "nap", "sleep"), "the sleep", child=first)[0]
    assert sleep["wake_at"] == pytest.approx(sleep["started_at"] + 3)
    time.sleep(max(0.0, sleep["started_at"] + 1.0 - time.time()))
    assert kit.status("nap") == ("running" if held else "sleeping")
    first.kill()

    second = kit.runner("wc_nap", "nap", [3], hold=hold)  # restarted at once
    assert second.output() == {"ok": True, "result": "after"}
    effects = kit.read_effects("nap")
    assert Counter(e["args"][0] for e in effects) == {"before": 1, "after": 1}
    before, after = effects
    assert before["pid"] == first.pid and after["pid"] == second.pid
    waited = after["t"] - second.started
    assert 1.2 <= waited <= 2.9, f"finished {waited:.2f}s after the restart (~2 s was left)"
    assert after["t"] >= sleep["wake_at"], "woke before the journaled wake-up time"
    assert [(r["kind"], r["status"]) for r in kit.journal("nap")] == [
        ("step", "completed"),
        ("sleep", "completed"),
        ("step", "completed"),
    ]


# --- signals -----------------------------------------------------------------------------


@pytest.mark.parametrize("held", [False, True], ids=["parked", "held-in-memory"])
def test_kill_while_waiting_then_signal_from_the_cli_with_no_engine(kit: Kit, held: bool) -> None:
    hold = 10.0 if held else 0.1
    first = kit.runner("wc_approval", "appr", hold=hold)
    if held:
        kit.wait_until(lambda: rows_of(kit, "appr", "signal"), "the wait", child=first)
        assert kit.status("appr") == "running"
    else:
        kit.wait_until(lambda: kit.status("appr") == "waiting", "status waiting", child=first)
    first.kill()
    if not held:
        assert "appr" in kit.cli("list", "--status", "waiting")

    # no engine runs anywhere now: the CLI commits the signal by itself
    out = kit.cli("signal", "appr", "approval", '{"approved": true}')
    assert "sent to appr" in out
    with durably.Client(kit.url) as client:
        assert client.get_event("appr", "stage") == "waiting for approval"
    assert [s["consumed_seq"] for s in signals(kit, "appr")] == [None]
    assert kit.labels("appr") == {"before": 1}

    second = kit.runner("wc_approval", "appr", hold=hold)
    assert second.output() == {"ok": True, "result": {"approved": True}}
    assert kit.labels("appr") == {"before": 1, "after": 1}  # nothing before the wait re-ran
    (wait,) = rows_of(kit, "appr", "signal")
    assert (wait["status"], json.loads(wait["payload"])) == ("completed", {"approved": True})
    assert [s["consumed_seq"] for s in signals(kit, "appr")] == [wait["seq"]]


def test_early_deduplicated_signals_are_taken_in_order_across_a_restart(kit: Kit) -> None:
    gate = kit.tmp / "gate"
    first = kit.runner("wc_two_approvals", "two", [str(gate)], hold=0.1)
    kit.wait_until(lambda: kit.labels("two")[str(gate)], "the gate step", child=first)

    # the workflow is inside its first step: no wait exists yet when the signal is sent
    assert "sent to two" in kit.cli("signal", "two", "approval", '{"n": 1}', "--key", "k1")
    assert "already sent" in kit.cli("signal", "two", "approval", '{"n": 1}', "--key", "k1")
    assert not rows_of(kit, "two", "signal")
    assert [(s["idempotency_key"], s["consumed_seq"]) for s in signals(kit, "two")] == [
        ("k1", None)
    ]
    gate.touch()

    # the first wait takes the early signal; kill the process at the second wait
    kit.wait_until(
        lambda: kit.labels("two")["between"] and kit.status("two") == "waiting",
        "the second wait",
        child=first,
    )
    first.kill()
    assert "already sent" in kit.cli("signal", "two", "approval", '{"n": 1}', "--key", "k1")
    assert "sent to two" in kit.cli("signal", "two", "approval", '{"n": 2}', "--key", "k2")

    second = kit.runner("wc_two_approvals", "two", [str(gate)], hold=0.1)
    assert second.output() == {"ok": True, "result": [{"n": 1}, {"n": 2}]}
    assert kit.labels("two") == {str(gate): 1, "between": 1, "end": 1}
    waits = rows_of(kit, "two", "signal")
    assert [json.loads(w["payload"]) for w in waits] == [{"n": 1}, {"n": 2}]
    sent = signals(kit, "two")
    assert [(s["idempotency_key"], json.loads(s["payload"])) for s in sent] == [
        ("k1", {"n": 1}),
        ("k2", {"n": 2}),
    ]
    assert [s["consumed_seq"] for s in sent] == [w["seq"] for w in waits]


# --- fan-out of children -------------------------------------------------------------------


def test_fan_out_of_50_children_one_failing_across_a_kill(kit: Kit) -> None:
    count, failing = 50, 17
    first = kit.runner("wc_fan_out", "fan", [count, failing], hold=0.2, poll=0.2)

    def finished_children() -> int:
        rows = kit.query(
            "SELECT COUNT(*) FROM workflows WHERE parent_id = 'fan' "
            "AND status IN ('completed', 'failed')"
        )
        return int(rows[0][0]) if rows else 0

    kit.wait_until(lambda: finished_children() >= count // 2, "half the children", child=first)
    first.kill()

    child_ids = [f"fan:{n + 1}" for n in range(count)]  # a child's id is "<parent>:<seq>"
    receipts = {
        r[0]
        for r in kit.query(
            "SELECT workflow_id FROM journal WHERE workflow_id LIKE 'fan:%' "
            "AND kind = 'step' AND status = 'completed'"
        )
        or []
    }
    ran_before = Counter(e["wf"] for e in kit.read_effects())
    in_flight = {c for c in child_ids if ran_before[c] and c not in receipts}
    assert count // 2 <= len(receipts) < count and in_flight, (len(receipts), in_flight)

    second = kit.runner("wc_fan_out", "fan", [count, failing], hold=0.2, poll=0.2)
    out = second.output(timeout=40)
    assert out["ok"], out
    result = out["result"]
    assert result["ids"] == child_ids
    assert result["ok"] == [[n, n * n] for n in range(count) if n != failing]
    assert result["failed"] == [[failing, f"ChildFailed: child {failing} failed"]]

    effects = kit.read_effects()
    ran = Counter(e["wf"] for e in effects)
    # a step with a receipt never ran again; one in flight at the kill ran once more
    expected = {c: ran_before[c] + (0 if c in receipts else 1) for c in child_ids}
    assert ran == expected
    assert all(ran[c] == (2 if c in in_flight else 1) for c in child_ids)
    keys = {c: {e["key"] for e in effects if e["wf"] == c} for c in child_ids}
    assert all(len(k) == 1 for k in keys.values()), keys  # a re-run kept its idempotency key
    assert len({next(iter(k)) for k in keys.values()}) == count
    statuses = Counter(kit.status(c) for c in child_ids)
    assert statuses == {"completed": count - 1, "failed": 1}
    assert kit.status("fan") == "completed"


# --- cancel, resume, fork from the command line ------------------------------------------------


@pytest.mark.parametrize("kind", ["step", "sleep", "wait"])
def test_cancel_from_the_cli_while_a_worker_process_runs_it(kit: Kit, kind: str) -> None:
    marker = kit.tmp / "slow-started"
    child = kit.runner("wc_cancellable", "c", [kind, str(marker)], hold=0.1, poll=0.2)
    if kind == "step":
        kit.wait_until(marker.exists, "the slow step", child=child)
    else:
        parked = "sleeping" if kind == "sleep" else "waiting"
        kit.wait_until(lambda: kit.status("c") == parked, f"status {parked}", child=child)
    asked = time.time()
    assert "cancellation requested: c" in kit.cli("cancel", "c")

    out = child.output(timeout=15)
    assert (out["ok"], out["error_type"]) == (False, "Cancelled"), out
    # not after the 30 s sleep (the slow step, 4 s, ends first and keeps its receipt)
    assert child.ended is not None and child.ended - asked < 10.0
    assert kit.status("c") == "cancelled"
    labels = kit.labels("c")
    assert labels[f"cleanup {kind}"] == 1  # the finally block's step ran once
    assert labels["after the slow step"] == 0
    kinds = [(r["kind"], r["name"], r["status"]) for r in kit.journal("c")]
    assert kinds[-1] == ("step", "wc_mark", "completed")  # the cleanup's receipt
    assert "cancel" in [k for k, _, _ in kinds]
    if kind == "step":  # the running step finished and kept its receipt
        assert labels[str(marker)] == 1
        assert kinds[0] == ("step", "wc_slow", "completed")


@pytest.mark.parametrize("kind", ["sleep", "wait"])
def test_cancel_from_the_cli_before_the_blocked_run_parks(kit: Kit, kind: str) -> None:
    """The cancel arrives while the blocked run is still held in memory (hold_seconds).

    The run learns of it only through the store; it must not park past it.
    """
    child = kit.runner("wc_cancellable", "c", [kind, "unused"], hold=1.0, poll=0.2)
    journaled = "sleep" if kind == "sleep" else "signal"
    kit.wait_until(lambda: rows_of(kit, "c", journaled), f"the {kind}", child=child)
    assert kit.status("c") == "running"
    asked = time.time()
    assert "cancellation requested: c" in kit.cli("cancel", "c")

    try:
        out = child.output(timeout=8)
    except AssertionError:
        row = kit.row("c")
        raise AssertionError(
            f"cancel not delivered 8 s after it was asked; the row is {row}"
        ) from None
    assert (out["ok"], out["error_type"]) == (False, "Cancelled"), out
    assert child.ended is not None and child.ended - asked < 5.0
    assert kit.status("c") == "cancelled"
    assert kit.labels("c") == {f"cleanup {kind}": 1}


def test_a_cancelled_workflow_that_waits_in_finally_still_parks(kit: Kit) -> None:
    """After the cancel is delivered, a wait in ``finally`` parks like any wait."""
    child = kit.runner("wc_cancel_then_wait", "cw", hold=0.1, poll=0.2)
    kit.wait_until(lambda: kit.status("cw") == "waiting", "the first wait", child=child)
    kit.cli("cancel", "cw")

    def parked_in_finally() -> bool:
        names = [(r["kind"], r["name"]) for r in kit.journal("cw")]
        return ("signal", "cleanup-ok") in names and kit.status("cw") == "waiting"

    kit.wait_until(parked_in_finally, "the wait in finally to park", child=child)
    claims = len(kit.query("SELECT epoch FROM claims WHERE workflow_id = 'cw'") or [])
    time.sleep(1.0)  # ten times hold_seconds: a run woken again and again would show here
    again = len(kit.query("SELECT epoch FROM claims WHERE workflow_id = 'cw'") or [])
    assert again == claims, f"claimed {again - claims} more times in a second of waiting"
    row = kit.row("cw")
    assert (row["status"], row["owner"], row["cancel_requested"]) == ("waiting", None, 1), row
    assert "cancel" in [r["kind"] for r in kit.journal("cw")]
    assert kit.labels("cw") == {}
    kit.cli("signal", "cw", "cleanup-ok")

    out = child.output(timeout=15)
    assert (out["ok"], out["error_type"]) == (False, "Cancelled"), out
    assert kit.status("cw") == "cancelled"
    assert kit.labels("cw") == {"cleanup": 1}


def test_resume_from_the_cli_then_a_worker_finishes_it(kit: Kit) -> None:
    broken = kit.tmp / "broken"
    broken.touch()
    out = kit.runner("wc_fragile_flow", "r", [str(broken)]).output()
    assert (out["ok"], out["error_type"]) == (False, "RuntimeError"), out
    assert out["message"] == "fragile broke"
    assert kit.status("r") == "failed"

    broken.unlink()
    assert "pending again" in kit.cli("resume", "r", "--no-wait")
    assert kit.status("r") == "pending"
    worker = kit.worker()
    kit.wait_until(lambda: kit.status("r") == "completed", "the resumed workflow", child=worker)
    worker.terminate()
    assert worker.wait(15) == 0, worker.describe()

    assert json.loads(kit.row("r")["output"]) == ["a", "fixed", "c"]
    assert kit.labels("r") == {"a": 1, str(broken): 2, "c": 1}  # only the failed step re-ran
    fragile = [e for e in kit.read_effects("r") if e["step"] == "wc_fragile"]
    assert [e["attempt"] for e in fragile] == [1, 2]
    assert fragile[0]["key"] == fragile[1]["key"]
    assert fragile[1]["pid"] == worker.pid


def test_fork_from_seq_3_reruns_only_what_follows(kit: Kit) -> None:
    steps = ["s1", "s2", "s3", "s4", "s5"]
    assert kit.runner("wc_five", "orig").output() == {"ok": True, "result": steps}
    assert [r["seq"] for r in kit.journal("orig")] == [1, 2, 3, 4, 5]

    fork_id = kit.cli("fork", "orig", "--from-seq", "3", "--id", "orig-fork", "--no-wait").strip()
    assert fork_id == "orig-fork"
    assert kit.runner("", "orig-fork", attach=True).output() == {"ok": True, "result": steps}

    assert kit.labels("orig") == Counter(steps)
    forked = kit.read_effects("orig-fork")
    assert [(e["args"][0], e["seq"]) for e in forked] == [("s4", 4), ("s5", 5)]
    assert [(r["seq"], r["status"]) for r in kit.journal("orig-fork")] == [
        (n, "completed") for n in range(1, 6)
    ]


# --- the CLI worker ---------------------------------------------------------------------------


def test_a_cli_worker_runs_started_and_signalled_workflows_and_drains_on_sigterm(
    kit: Kit,
) -> None:
    assert kit.cli("start", f"{FLOWS}:wc_five", "[]", "--id", "w-five", "--no-wait").strip() == (
        "w-five"
    )
    kit.cli("start", f"{FLOWS}:wc_approval", "[]", "--id", "w-sig", "--no-wait")
    assert (kit.status("w-five"), kit.status("w-sig")) == ("pending", "pending")
    assert kit.read_effects() == []

    worker = kit.worker()
    kit.wait_until(lambda: kit.status("w-five") == "completed", "w-five", child=worker)
    kit.wait_until(lambda: kit.status("w-sig") == "waiting", "w-sig to park", child=worker)
    assert "sent to w-sig" in kit.cli("signal", "w-sig", "approval", '{"approved": true}')
    kit.wait_until(lambda: kit.status("w-sig") == "completed", "the signalled one", child=worker)
    assert json.loads(kit.row("w-sig")["output"]) == {"approved": True}
    assert kit.labels("w-five") == Counter(["s1", "s2", "s3", "s4", "s5"])
    assert kit.labels("w-sig") == {"before": 1, "after": 1}

    # SIGTERM while a step runs: the step finishes and commits, then the worker exits 0
    marker = kit.tmp / "slow-started"
    kit.cli("start", f"{FLOWS}:wc_slow_then", json.dumps([str(marker)]), "--id", "w-slow",
            "--no-wait")  # fmt: skip
    kit.wait_until(marker.exists, "the worker to start the slow step", child=worker)
    worker.terminate()
    assert worker.wait(20) == 0, worker.describe()
    assert "stopped" in worker.stdout()
    assert kit.labels("w-slow") == {str(marker): 1}
    assert [(r["name"], r["status"]) for r in kit.journal("w-slow")] == [("wc_slow", "completed")]
    row = kit.row("w-slow")
    assert row["owner"] is None and row["status"] not in ("completed", "failed"), row

    # the next engine finishes it without running the slow step again
    second = kit.runner("", "w-slow", attach=True, poll=0.2)
    assert second.output() == {"ok": True, "result": ["slow done", "after slow"]}
    assert kit.labels("w-slow") == {str(marker): 1, "after slow": 1}
