"""An approval of a wrapped framework's tool call, decided from another process.

Process 1 runs the agent until it parks on the approval and exits; this test
process approves through a Client; process 2 resumes the workflow. The tool
runs once, and no model turn answered before the park is asked again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools

REFUND = tool_calls(call("refund", {"order_id": "A1", "cents": 50_000}, id="call_r"))


def _runner(flows: str, db: Path, env: dict[str, str], *extra: str) -> Any:
    argv = ["-m", "tests.integkit.runner", "--flows", flows, "--workflow", "support"]
    done = harness.run([*argv, "--db", str(db), "--id", "wf", "--input", "refund A1", *extra], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flows", ["tests.integkit.pai_flows", "tests.integkit.oai_flows"])
def test_an_approval_from_another_process_resumes_the_parked_run(
    flows: str, tmp_path: Path
) -> None:
    db, effects, log = tmp_path / "a.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn([REFUND, text("Refunded.")]), log_path=log) as server:
        env = harness.child_env(server.url, effects)
        parked = _runner(flows, db, env, "--until", "waiting")
        assert parked == {"status": "waiting"}
        assert tools.effects(effects) == []
        with durably.Client(f"sqlite:///{db}") as client:
            [pending] = agents.list_approvals(client)
            assert (pending.tool, pending.arguments) == (
                "refund",
                {"order_id": "A1", "cents": 50_000},
            )
            agents.approve(client, "wf", by="alice", expect=pending)
        done = _runner(flows, db, env)

    assert done["status"] == "completed", done
    assert done["result"]["output"] == "Refunded."
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["order_id"], ran["cents"]) == ("refund", "A1", 50_000)
    assert [r["turn"] for r in read_log(log)] == [0, 1]  # the parked turn was not asked again
    assert (done["result"]["replayed"]["calls"], done["result"]["billed"]["calls"]) == (1, 1)
