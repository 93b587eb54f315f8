"""``durably.testing.crash_points`` and ``durably test-crashes`` over the refund agent.

The tool kills the workflow at every boundary of an uninterrupted run, recovers
it, and judges each recovery against the policy of ``issue_refund`` (plain,
reconcile or at-most-once). These tests check the tool's report against the
payments service's own log, and that a broken reconcile function is reported.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from durably.cli import crashes as cli_crashes
from durably.testing import CrashToolError, crash_points, payments
from durably.testing.crashes import KeyCount, Scenario
from tests import children
from tests.crashkit import refund_flows
from tests.crashkit.refund_flows import OUTBOX, PAYMENTS_ENV

TARGET = "tests.crashkit.refund_flows:refund_flow"
FLAVOUR: dict[str, payments.Flavour] = {
    "plain": "idempotent",
    "reconcile": "lookup",
    "at_most_once": "plain",
}
UNKNOWN = ("after_intent", "before_call", "after_call")
Service = Callable[[payments.Flavour], payments.FakePaymentsServer]


@pytest.fixture
def service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[payments.Flavour], payments.FakePaymentsServer]]:
    """Start a payments service of a flavour; its URL goes to the child processes."""
    with contextlib.ExitStack() as stack:

        def start(flavour: payments.Flavour) -> payments.FakePaymentsServer:
            log = tmp_path / "payments.jsonl"
            server = stack.enter_context(payments.FakePaymentsServer(log, flavour=flavour))
            monkeypatch.setenv(PAYMENTS_ENV, server.url)
            return server

        yield start


def expected_boundaries(policy: str) -> list[str]:
    """Every boundary the refund flow reaches without a crash, in order."""
    out = ["engine_start@1"]
    for step in ("lookup_order", "issue_refund", "send_receipt"):
        if step == "issue_refund" and policy != "plain":
            out += [f"before_intent:{step}@1", f"after_intent:{step}@1"]
        out += [f"before_call:{step}@1", f"after_call:{step}@1", f"after_receipt:{step}@1"]
    return [*out, "before_finish:refund-flow@1", "after_finish:refund-flow@1"]


def refund_count(s: Scenario) -> KeyCount:
    (count,) = [k for k in s.keys if k.step == "issue_refund"]
    return count


@pytest.mark.parametrize("policy", ["plain", "reconcile", "at_most_once"])
def test_every_boundary_of_the_refund_agent_recovers_as_its_policy_says(
    policy: str, service: Service, tmp_path: Path
) -> None:
    server = service(FLAVOUR[policy])
    report = crash_points(
        TARGET,
        ["ORD-9912", policy],
        workdir=tmp_path / "scenarios",
        effects=str(server.log_path),
    )

    assert [str(s.boundary) for s in report.scenarios] == expected_boundaries(policy)
    assert report.ok, report.table()
    assert report.baseline.status == "completed"
    lines = (report.baseline.directory / "calls.jsonl").read_text().splitlines()
    events = [(c["event"], c["step"]) for c in map(json.loads, lines)]
    steps = ["lookup_order", "issue_refund", "send_receipt"]
    assert events == [(event, step) for step in steps for event in ("call", "receipt")]
    text = report.table()
    for spec in expected_boundaries(policy):
        assert spec in text
    for s in report.scenarios:
        assert s.boundary is not None
        assert s.died, s
        assert s.exit_codes[0] == -9
        refund = refund_count(s)
        on_refund = s.boundary.step == "issue_refund"
        if policy == "at_most_once" and on_refund and s.boundary.point in UNKNOWN:
            assert (s.status, s.verdict) == ("needs_review", "review"), s
            called = 1 if s.boundary.point == "after_call" else 0
            assert (refund.calls, refund.effects) == (called, called), s
            continue
        assert (s.status, s.verdict) == ("completed", "ok"), s
        assert s.result["refund_id"] is not None
        twice = policy == "plain" and on_refund and s.boundary.point == "after_call"
        assert (refund.calls, refund.effects) == ((2, 2) if twice else (1, 1)), s
        others = {k.step: k.calls for k in s.keys if k.step != "issue_refund"}
        rerun = s.boundary.step if s.boundary.point == "after_call" else None
        assert others == {
            name: 2 if name == rerun else 1 for name in ("lookup_order", "send_receipt")
        }, s

    posts = [r for r in payments.read_log(server.log_path) if r["method"] == "POST"]
    per_key = collections.Counter(r["idempotency_key"] for r in posts)
    created = collections.Counter(r["idempotency_key"] for r in posts if r["created"])
    # every scenario refunds under its own key, except at-most-once parked before the call
    assert len(per_key) == 1 + len(report.scenarios) - (2 if policy == "at_most_once" else 0)
    assert set(created.values()) == {1}  # every scenario's key made exactly one refund
    limit = 2 if policy == "plain" else 1
    assert max(per_key.values()) == limit


def test_the_command_prints_every_boundary_and_exits_zero(tmp_path: Path) -> None:
    """Through the command line: ``durably test-crashes`` once the CLI registers it."""
    argv = children.python("-m", "durably.cli", "test-crashes")
    with payments.FakePaymentsServer(tmp_path / "payments.jsonl", flavour="plain") as server:
        env = children.child_env({PAYMENTS_ENV: server.url, "COLUMNS": "200"})
        proc = subprocess.run(
            [
                *argv,
                TARGET,
                json.dumps(["ORD-9912", "at_most_once"]),
                "--effects-log",
                str(server.log_path),
                "--only",
                "*:issue_refund@*",
                "--workdir",
                str(tmp_path / "scenarios"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for spec in expected_boundaries("at_most_once"):
        if ":issue_refund@" in spec:
            assert spec in proc.stdout
    assert "5 boundaries crashed: 2 ok, 3 parked for review as declared, 0 violations" in (
        proc.stdout
    )


def test_a_reconcile_that_misses_the_refund_is_a_violation(
    service: Service, tmp_path: Path
) -> None:
    server = service("lookup")
    result = CliRunner().invoke(
        cli_crashes.test_crashes_command,
        [
            TARGET,
            json.dumps(
                {"order_id": "ORD-9912", "policy": "reconcile", "reconcile_mode": "notfound"}
            ),
            "--effects-log",
            str(server.log_path),
            "--only",
            "after_call:issue_refund@1",
            "--workdir",
            str(tmp_path / "scenarios"),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 1, result.output
    assert "VIOLATION" in result.output
    assert "reconcile step issue_refund called 2 times" in result.output
    assert "reached the outside 2 times (allowed 1)" in result.output


def test_a_reconcile_that_cannot_decide_is_a_violation(service: Service, tmp_path: Path) -> None:
    service("lookup")
    report = crash_points(
        TARGET,
        kwargs={"order_id": "ORD-9912", "policy": "reconcile", "reconcile_mode": "unknown"},
        workdir=tmp_path,
        only=["after_call:issue_refund@1"],
    )
    (s,) = report.scenarios
    assert not report.ok
    assert s.status == "needs_review"
    assert s.problems == (
        "parked in needs_review (seq 2 issue_refund: reconcile answered durably.Unknown)",
    )
    assert report.violations == [s]
    assert "VIOLATION" in report.table()


def test_effects_from_the_scenario_directory(service: Service, tmp_path: Path) -> None:
    """A relative effect log is read in each scenario's DURABLY_SCENARIO_DIR; a callable too."""
    service("idempotent")

    def outbox(folder: Path) -> dict[str, int]:
        lines = payments.read_log(folder / OUTBOX)
        return dict(collections.Counter(str(line["idempotency_key"]) for line in lines))

    for effects in (OUTBOX, outbox):
        report = crash_points(
            refund_flows.refund_flow,  # a decorated workflow works as well as "module:name"
            ["ORD-9912"],
            workdir=tmp_path / ("relative" if isinstance(effects, str) else "callable"),
            effects=effects,
            only=["after_call:send_receipt@1"],
        )
        assert report.ok, report.table()
        (s,) = report.scenarios
        (receipt,) = [k for k in s.keys if k.step == "send_receipt"]
        assert (receipt.calls, receipt.effects, receipt.limit_effects) == (2, 2, 2)
        assert receipt.key == f"{s.workflow_id}:3"
        assert (s.directory / OUTBOX).exists()


def test_a_target_that_cannot_be_imported_is_reported(tmp_path: Path) -> None:
    with pytest.raises(CrashToolError, match="no_such_module"):
        crash_points("no_such_module:flow", workdir=tmp_path)
    with pytest.raises(CrashToolError, match="module:workflow"):
        crash_points("just_a_name", workdir=tmp_path)


def test_compensations_are_crashed_too_and_the_original_error_stays(
    service: Service, tmp_path: Path
) -> None:
    server = service("idempotent")
    report = crash_points(
        "tests.crashkit.refund_flows:checkout",
        ["ORD-7"],
        workdir=tmp_path / "scenarios",
        effects=str(server.log_path),
        only=["*:compensate:*"],
    )
    assert report.ok, report.table()
    assert report.baseline.status == "failed"
    assert report.baseline.error == "ShippingFailed: carrier rejected ORD-7"
    assert [str(s.boundary) for s in report.scenarios] == [
        f"{point}:compensate:{undo}@1"
        for undo in ("refund_deposit", "refund_card")
        for point in ("before_call", "after_call", "after_receipt")
    ]
    for s in report.scenarios:
        assert s.died and (s.status, s.error) == ("failed", report.baseline.error), s
        assert s.boundary is not None
        for k in s.keys:
            if k.step.startswith("compensate:"):
                again = s.boundary.point == "after_call" and s.boundary.step == k.step
                assert (k.calls, k.effects) == ((2, 2) if again else (1, 1)), s
    created = [r for r in payments.read_log(server.log_path) if r["created"]]
    assert len(created) == 2 * (1 + len(report.scenarios))  # one refund per undo, per run


def test_a_workflows_own_step_after_branches_is_not_taken_for_a_rerun(tmp_path: Path) -> None:
    """Branches' steps took seqs 1 and 2, and the workflow function's own step is keyed
    by its count of calls (``"<id>:1"``): a receipt is the call at its seq, not a key made
    of that seq, or the own step reads as the branch's step running again."""
    report = crash_points(
        "tests.crashkit.flows:branches_then_own", [], workdir=tmp_path / "scenarios"
    )
    assert report.scenarios
    assert [(str(s.boundary), s.problems) for s in report.scenarios if s.problems] == []
