"""Real SIGKILLs at the engine's commit boundaries, and recovery from them.

Every test runs the workflow in child processes on a real SQLite file, kills
one (from inside via ``DURABLY_CRASH_AT``, or from outside), restarts until it
is done, and counts the effects file: what ran, how often, with which key.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.crashkit import flows
from tests.crashkit.harness import (
    Workflow,
    claims,
    count_by_step,
    crash_once,
    journal_rows,
    kill_when,
    of_step,
    read_effects,
    run_once,
    run_until_done,
    workflow_row,
)

LINEAR_STEPS = ["step_a", "step_b", "step_c", "step_d"]


def linear(tmp_path: Path, **options: object) -> Workflow:
    return Workflow(
        db=tmp_path / "durably.db",
        workflow="linear",
        workflow_id="wf-linear",
        args=[1],
        effects=tmp_path / "effects.jsonl",
        **options,  # type: ignore[arg-type]
    )


def assert_keys_stable(effects: list[dict[str, object]]) -> None:
    """One idempotency key per seq, different keys for different seqs."""
    keys: dict[object, set[object]] = {}
    for e in effects:
        keys.setdefault(e["seq"], set()).add(e["key"])
    assert all(len(k) == 1 for k in keys.values()), keys
    flat = [next(iter(k)) for k in keys.values()]
    assert len(set(flat)) == len(flat), keys


def test_kill_before_receipt_reruns_the_step_with_the_same_key(tmp_path: Path) -> None:
    wf = linear(tmp_path)
    exits = run_until_done(wf, [crash_once("after_call:step_c", tmp_path / "crashed")])

    assert [e.returncode for e in exits] == [-9, 0]
    assert exits[-1].output() == {"ok": True, "result": flows.linear_expected(1)}
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == {"step_a": 1, "step_b": 1, "step_c": 2, "step_d": 1}
    runs_of_c = of_step(effects, "step_c")
    assert runs_of_c[0]["key"] == runs_of_c[1]["key"]
    assert runs_of_c[0]["pid"] != runs_of_c[1]["pid"]
    assert runs_of_c[0]["args"] == runs_of_c[1]["args"]
    assert_keys_stable(effects)
    assert [r["status"] for r in journal_rows(wf.db, wf.workflow_id)] == ["completed"] * 4


def test_kill_after_receipt_never_reruns_the_step(tmp_path: Path) -> None:
    wf = linear(tmp_path)
    exits = run_until_done(wf, [crash_once("after_receipt:step_b", tmp_path / "crashed")])

    assert [e.returncode for e in exits] == [-9, 0]
    assert exits[-1].output() == {"ok": True, "result": flows.linear_expected(1)}
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == dict.fromkeys(LINEAR_STEPS, 1)
    # step_b ran in the killed process, step_c only in the recovering one
    pids = {e["step"]: e["pid"] for e in effects}
    assert pids["step_a"] == pids["step_b"] != pids["step_c"] == pids["step_d"]
    assert_keys_stable(effects)


def test_kill_during_backoff_waits_only_what_remained(tmp_path: Path) -> None:
    wf = Workflow(
        db=tmp_path / "durably.db",
        workflow="with_backoff",
        workflow_id="wf-backoff",
        args=[1],
        effects=tmp_path / "effects.jsonl",
    )
    pause = 0.5  # the process stays dead for half of the back-off
    exits = run_until_done(
        wf, [crash_once("in_backoff:flaky_once", tmp_path / "crashed")], pause_after_kill=pause
    )

    assert [e.returncode for e in exits] == [-9, 0]
    assert exits[-1].output() == {"ok": True, "result": [2, 102, 1020]}
    effects = read_effects(wf.effects)
    flaky = of_step(effects, "flaky_once")
    assert [e["attempt"] for e in flaky] == [1, 2]  # the failed attempt is not repeated
    assert flaky[0]["key"] == flaky[1]["key"]
    assert count_by_step(effects) == {"step_a": 1, "flaky_once": 2, "step_d": 1}
    # the second attempt waited for the journaled wake-up time, not less...
    assert flaky[1]["t"] - flaky[0]["t"] >= flows.BACKOFF - 0.05
    # ...and not a fresh back-off after the restart: that would end no sooner than
    # pause + start-up + BACKOFF after the kill, while what remained ends BACKOFF after
    # the failed attempt (or as soon as the new process is up, if that is later)
    from_kill = exits[-1].ended - exits[0].ended
    assert from_kill < pause + flows.BACKOFF, f"{from_kill:.2f}s from the kill to the end"
    assert flaky[1]["t"] - exits[-1].started < flows.BACKOFF, "a whole back-off after restart"
    rows = journal_rows(wf.db, wf.workflow_id)
    assert (rows[1]["name"], rows[1]["status"], rows[1]["attempt"]) == (
        "flaky_once",
        "completed",
        2,
    )


def test_kill_at_engine_start_then_recover_a_half_done_workflow(tmp_path: Path) -> None:
    wf = linear(tmp_path)
    plan = [
        crash_once("after_receipt:step_b", tmp_path / "crash1"),  # leaves it half done
        crash_once("engine_start", tmp_path / "crash2"),  # the next start dies too
    ]
    exits = run_until_done(wf, plan)

    assert [e.returncode for e in exits] == [-9, -9, 0]
    assert (tmp_path / "crash2").read_text().startswith("engine_start")
    assert exits[-1].output() == {"ok": True, "result": flows.linear_expected(1)}
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == dict.fromkeys(LINEAR_STEPS, 1)
    assert [c["reason"] for c in claims(wf.db, wf.workflow_id)] == ["start", "recovery"]


def test_kill_from_outside_while_a_step_sleeps(tmp_path: Path) -> None:
    marker = tmp_path / "sleeping"
    wf = Workflow(
        db=tmp_path / "durably.db",
        workflow="sleepy",
        workflow_id="wf-sleepy",
        args=[1, str(marker)],
        effects=tmp_path / "effects.jsonl",
    )
    first = kill_when(wf, marker)
    assert first.killed, first.describe()
    assert count_by_step(read_effects(wf.effects)) == {"step_a": 1, "sleeper": 1}

    exits = run_until_done(wf)
    assert exits[-1].output() == {"ok": True, "result": [2, "woke", 20]}
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == {"step_a": 1, "sleeper": 2, "step_d": 1}
    runs = of_step(effects, "sleeper")
    assert runs[0]["key"] == runs[1]["key"]
    assert runs[0]["seq"] == runs[1]["seq"] == 2
    assert runs[0]["pid"] != runs[1]["pid"]
    assert_keys_stable(effects)


def test_dead_owner_on_this_host_is_replaced_without_waiting_for_its_lease(
    tmp_path: Path,
) -> None:
    wf = linear(tmp_path, lease_seconds=60.0)
    first = run_once(wf, crash_once("after_receipt:step_b", tmp_path / "crashed"))
    assert first.killed, first.describe()
    owner = workflow_row(wf.db, wf.workflow_id)["owner"]
    assert owner is not None  # the dead executor still holds a 60 s lease

    began = time.monotonic()
    second = run_once(wf)
    elapsed = time.monotonic() - began

    assert second.output() == {"ok": True, "result": flows.linear_expected(1)}
    assert elapsed < 10.0, f"took {elapsed:.1f}s: waited for the lease?"
    history = claims(wf.db, wf.workflow_id)
    assert [c["reason"] for c in history] == ["start", "recovery"]
    assert history[1]["previous_owner"] == owner != history[1]["owner"]
    assert count_by_step(read_effects(wf.effects)) == dict.fromkeys(LINEAR_STEPS, 1)


def test_a_workflow_s_own_max_recoveries_ends_it_after_its_sigkills(tmp_path: Path) -> None:
    """@durably.workflow(max_recoveries=1) on an engine allowing 5: two SIGKILLs, then failed."""
    wf = Workflow(
        db=tmp_path / "durably.db",
        workflow="crashes_executor_limited",
        workflow_id="wf-limited",
        args=[1],
        effects=tmp_path / "effects.jsonl",
        max_recoveries=5,
    )
    exits = run_until_done(wf, max_runs=5)
    assert [e.returncode for e in exits] == [-9, -9, 0]
    out = exits[-1].output()
    assert (
        out["error_type"] == "WorkflowFailed" and "crashed its executor 2 times" in out["message"]
    )
    assert workflow_row(wf.db, wf.workflow_id)["status"] == "failed"
    assert count_by_step(read_effects(wf.effects)) == {"step_a": 1, "kill_self": 2}


def test_a_workflow_that_keeps_killing_its_executor_is_failed(tmp_path: Path) -> None:
    max_recoveries = 2
    wf = Workflow(
        db=tmp_path / "durably.db",
        workflow="crashes_executor",
        workflow_id="wf-boom",
        args=[1],
        effects=tmp_path / "effects.jsonl",
        max_recoveries=max_recoveries,
    )
    exits = run_until_done(wf, max_runs=max_recoveries + 3)

    # the first run and max_recoveries recoveries die; the next one gives up
    assert [e.returncode for e in exits] == [-9] * (max_recoveries + 1) + [0]
    out = exits[-1].output()
    assert out["ok"] is False, out
    assert out["error_type"] == "WorkflowFailed", out
    assert "crashed its executor" in out["message"], out
    row = workflow_row(wf.db, wf.workflow_id)
    assert row["status"] == "failed"
    assert "crashed its executor" in row["error"]
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == {"step_a": 1, "kill_self": max_recoveries + 1}
    assert len({e["key"] for e in of_step(effects, "kill_self")}) == 1
