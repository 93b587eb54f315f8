"""Replay is checked: code that changed between a crash and its recovery is stopped.

The ``ordered`` workflow calls the steps named in a file; the test kills it
after some receipts, rewrites the file, and recovers it in a new process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import durably
from tests.crashkit.harness import (
    Workflow,
    count_by_step,
    crash_once,
    journal_rows,
    read_effects,
    run_once,
    workflow_row,
)


def ordered(tmp_path: Path, order: list[str], catch: bool = False) -> Workflow:
    order_file = tmp_path / "order.json"
    order_file.write_text(json.dumps(order))
    return Workflow(
        db=tmp_path / "durably.db",
        workflow="ordered",
        workflow_id="wf-ordered",
        args=[str(order_file), catch],
        effects=tmp_path / "effects.jsonl",
    )


def crash_after(wf: Workflow, step: str, tmp_path: Path) -> None:
    first = run_once(wf, crash_once(f"after_receipt:{step}", tmp_path / "crashed"))
    assert first.killed, first.describe()


def rewrite_order(wf: Workflow, order: list[str]) -> None:
    Path(wf.args[0]).write_text(json.dumps(order))


def result_in_process(wf: Workflow) -> object:
    """``handle.result()`` of the workflow, from an engine in this process."""

    async def main() -> object:
        async with durably.Engine(f"sqlite:///{wf.db}") as engine:
            return await engine.handle(wf.workflow_id).result(timeout=10)

    return asyncio.run(main())


def test_changed_step_order_after_a_crash_diverges(tmp_path: Path) -> None:
    wf = ordered(tmp_path, ["alpha", "beta", "gamma"])
    crash_after(wf, "beta", tmp_path)
    rewrite_order(wf, ["alpha", "gamma", "beta"])

    recovered = run_once(wf)
    out = recovered.output()
    assert out["ok"] is False and out["error_type"] == "NonDeterminismError", out

    assert workflow_row(wf.db, wf.workflow_id)["status"] == "diverged"
    with pytest.raises(durably.NonDeterminismError) as caught:
        result_in_process(wf)
    message = str(caught.value)
    assert "seq 2" in message, message
    assert "'beta'" in message and "'gamma'" in message, message
    assert caught.value.seq == 2
    # nothing ran after the divergence: gamma never, beta and alpha only in the first run
    effects = read_effects(wf.effects)
    assert count_by_step(effects) == {"alpha": 1, "beta": 1}
    assert [r["name"] for r in journal_rows(wf.db, wf.workflow_id)] == ["alpha", "beta"]


def test_returning_early_while_the_journal_holds_more_diverges(tmp_path: Path) -> None:
    wf = ordered(tmp_path, ["alpha", "beta", "gamma"])
    crash_after(wf, "beta", tmp_path)
    rewrite_order(wf, ["alpha"])

    out = run_once(wf).output()
    assert out["ok"] is False and out["error_type"] == "NonDeterminismError", out
    row = workflow_row(wf.db, wf.workflow_id)
    assert row["status"] == "diverged"
    assert row["output"] is None
    with pytest.raises(durably.NonDeterminismError) as caught:
        result_in_process(wf)
    assert caught.value.seq == 2
    assert "'beta'" in str(caught.value)
    assert count_by_step(read_effects(wf.effects)) == {"alpha": 1, "beta": 1}


def test_catching_the_divergence_in_workflow_code_still_diverges(tmp_path: Path) -> None:
    wf = ordered(tmp_path, ["alpha", "beta", "gamma"], catch=True)
    crash_after(wf, "beta", tmp_path)
    rewrite_order(wf, ["alpha", "gamma", "beta", "gamma"])

    out = run_once(wf).output()
    assert out["ok"] is False and out["error_type"] == "NonDeterminismError", out
    assert workflow_row(wf.db, wf.workflow_id)["status"] == "diverged"
    with pytest.raises(durably.NonDeterminismError) as caught:
        result_in_process(wf)
    assert caught.value.seq == 2
    assert "'beta'" in str(caught.value) and "'gamma'" in str(caught.value)
    # the swallowed error did not let any later step run
    assert count_by_step(read_effects(wf.effects)) == {"alpha": 1, "beta": 1}
    assert [r["name"] for r in journal_rows(wf.db, wf.workflow_id)] == ["alpha", "beta"]


def test_unchanged_order_recovers_normally(tmp_path: Path) -> None:
    """The control: the same harness without a change completes."""
    wf = ordered(tmp_path, ["alpha", "beta", "gamma"])
    crash_after(wf, "beta", tmp_path)
    out = run_once(wf).output()
    assert out == {"ok": True, "result": ["alpha:alpha", "beta:beta", "gamma:gamma"]}
    assert count_by_step(read_effects(wf.effects)) == {"alpha": 1, "beta": 1, "gamma": 1}
