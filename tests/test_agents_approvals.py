"""Approval-gated tool calls: park, decide from anywhere once, bound to the arguments shown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools
from tests.agentkit.live import live, until


@agents.tool(requires_approval=True, approval_timeout=0.3)
async def wire(account: str, cents: int) -> str:
    """Wire money; silence means no."""
    tools.effect("wire", account=account, cents=cents)
    return "wired"


@agents.tool(requires_approval=True, approval_timeout=0.3, on_approval_timeout="approve")
async def ping(host: str) -> str:
    """Ping a host; silence means yes."""
    tools.effect("ping", host=host)
    return "pong"


@durably.workflow(name="approvals-direct")
async def direct_flow(order_id: str, cents: int) -> Any:
    try:
        return await tools.refund(order_id, cents)
    except agents.ApprovalRejected as exc:
        return {"rejected": str(exc), "by": exc.by, "reason": exc.reason}


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


def _tool_messages(server: FakeModelServer) -> list[dict[str, Any]]:
    return [m for m in server.requests[-1]["body"]["messages"] if m["role"] == "tool"]


REFUND = tool_calls(call("refund", {"order_id": "A1", "cents": 50_000}, id="call_r"))


async def test_a_gated_call_parks_and_runs_once_when_approved(
    sqlite_url: str, effects: Path
) -> None:
    async with live(sqlite_url, [REFUND, text("Refunded.")], [tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        assert tools.effects(effects) == []
        [pending] = await agents.list_approvals(s.engine)
        assert (pending.workflow_id, pending.tool, pending.tool_call_id) == (
            "wf",
            "refund",
            "call_r",
        )
        assert pending.arguments == {"order_id": "A1", "cents": 50_000}
        assert pending.args_sha256 == agents.args_hash(pending.arguments)
        published = await s.engine.get_event("wf", "approval:call_r")
        assert published["status"] == "pending" and published["arguments"] == pending.arguments
        decided = await agents.approve(s.engine, "wf", by="alice", expect=pending)
        assert decided == pending
        assert (await handle.result(timeout=10))["output"] == "Refunded."
        history = await s.engine.history("wf")
        final = await s.engine.get_event("wf", "approval:call_r")
        assert await agents.list_approvals(s.engine) == []
        with pytest.raises(agents.ApprovalNotPending):
            await agents.approve(s.engine, "wf", by="alice")
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["cents"]) == ("refund", 50_000)
    [signal] = [e for e in history if e.kind == "signal"]
    payload = json.loads(signal.payload or "{}")
    assert (signal.name, payload["decision"], payload["by"]) == (
        "approval:call_r",
        "approve",
        "alice",
    )
    assert payload["at"] and payload["args_sha256"] == pending.args_sha256
    assert (final["status"], final["decided_by"]) == ("approved", "alice")


async def test_a_call_the_predicate_allows_is_not_gated(sqlite_url: str, effects: Path) -> None:
    small = tool_calls(call("refund", {"order_id": "A1", "cents": 500}))
    async with live(sqlite_url, [small, text("ok")], [tools.refund]) as s:
        result = await (await s.start()).result(timeout=10)
        kinds = [e.kind for e in await s.engine.history("wf")]
    assert result["output"] == "ok"
    assert "signal" not in kinds and len(tools.effects(effects)) == 1


async def test_a_rejection_reaches_the_model_as_the_tool_result(
    sqlite_url: str, effects: Path
) -> None:
    async with live(sqlite_url, [REFUND, text("Sorry.")], [tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        await agents.reject(s.engine, "wf", by="bob", reason="too large")
        assert (await handle.result(timeout=10))["output"] == "Sorry."
        [message] = _tool_messages(s.server)
    assert message == {
        "role": "tool",
        "tool_call_id": "call_r",
        "content": '{"error": "rejected by bob: too large"}',
    }
    assert tools.effects(effects) == []


async def until_consumed(engine: durably.Engine, wid: str, name: str) -> None:
    """Wait until every signal ``name`` sent to ``wid`` was taken by the workflow."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while True:
        sent = [x for x in await engine.signals(wid) if x["name"] == name]
        if sent and all(x["consumed_seq"] is not None for x in sent):
            return
        assert loop.time() < deadline, f"signal {name!r} not consumed in 10 s: {sent}"
        await asyncio.sleep(0.02)


async def test_a_decision_on_other_arguments_is_refused(sqlite_url: str, effects: Path) -> None:
    async with live(sqlite_url, [REFUND, text("Refunded.")], [tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        shown = agents.args_hash({"order_id": "A1", "cents": 5_000})
        with pytest.raises(agents.ApprovalStale):
            await agents.approve(s.engine, "wf", by="alice", expect=shown)
        # a raw signal bound to other arguments is consumed but not obeyed
        forged = {"decision": "approve", "by": "mallory", "args_sha256": shown}
        await s.engine.send_signal("wf", "approval:call_r", forged)
        await until_consumed(s.engine, "wf", "approval:call_r")
        await until(handle, "waiting")  # read, refused, and waiting again for a real decision
        assert tools.effects(effects) == []
        await agents.approve(s.engine, "wf", by="alice", tool_call_id="call_r")
        assert (await handle.result(timeout=10))["output"] == "Refunded."
    assert len(tools.effects(effects)) == 1


async def test_approving_with_changed_arguments_runs_those_and_tells_the_model(
    sqlite_url: str, effects: Path
) -> None:
    async with live(sqlite_url, [REFUND, text("Partly refunded.")], [tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        changed = {"order_id": "A1", "cents": 10_000}
        await agents.approve(s.engine, "wf", by="carol", override_args=changed)
        await handle.result(timeout=10)
        [message] = _tool_messages(s.server)
    assert [e["cents"] for e in tools.effects(effects)] == [10_000]
    content = json.loads(message["content"])
    assert content["arguments_used"] == changed and "carol" in content["note"]


async def test_approval_timeout_rejects_or_approves_as_declared(
    sqlite_url: str, effects: Path
) -> None:
    turn = tool_calls(
        call("wire", {"account": "X", "cents": 1}, id="c_wire"),
        call("ping", {"host": "h"}, id="c_ping"),
    )
    async with live(sqlite_url, [turn, text("done")], [wire, ping]) as s:
        handle = await s.start()
        assert (await handle.result(timeout=10))["output"] == "done"
        messages = _tool_messages(s.server)
    assert [e["kind"] for e in tools.effects(effects)] == ["ping"]
    assert messages[0]["content"] == '{"error": "rejected by timeout: no decision in time"}'
    assert messages[1]["content"] == "pong"


async def test_parallel_gated_calls_are_decided_one_by_one(sqlite_url: str, effects: Path) -> None:
    turn = tool_calls(
        call("lookup_order", {"order_id": "A1"}, id="c1"),
        call("refund", {"order_id": "A1", "cents": 20_000}, id="c2"),
        call("refund", {"order_id": "A2", "cents": 30_000}, id="c3"),
    )
    async with live(sqlite_url, [turn, text("done")], [tools.lookup_order, tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        assert [e["kind"] for e in tools.effects(effects)] == ["lookup"]  # ran meanwhile
        pending = await agents.list_approvals(s.engine, "wf")
        assert [p.tool_call_id for p in pending] == ["c2", "c3"]
        with pytest.raises(agents.ApprovalNotPending, match="2 pending"):
            await agents.approve(s.engine, "wf", by="alice")
        await agents.reject(s.engine, "wf", by="alice", reason="no", tool_call_id="c3")
        await agents.approve(s.engine, "wf", by="alice", tool_call_id="c2")
        await handle.result(timeout=10)
        messages = _tool_messages(s.server)
    assert [m["tool_call_id"] for m in messages] == ["c1", "c2", "c3"]
    assert messages[2]["content"] == '{"error": "rejected by alice: no"}'
    assert [e.get("order_id") for e in tools.effects(effects)] == ["A1", "A1"]


async def test_a_direct_call_of_a_gated_tool_waits_too(sqlite_url: str, effects: Path) -> None:
    async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
        yes = await engine.start(direct_flow, "A1", 50_000, workflow_id="yes")
        no = await engine.start(direct_flow, "A2", 60_000, workflow_id="no")
        small = await engine.start(direct_flow, "A3", 100, workflow_id="small")
        await until(yes, "waiting")
        await until(no, "waiting")
        ids = sorted(p.workflow_id for p in await agents.list_approvals(engine))
        assert ids == ["no", "yes"]
        await agents.approve(engine, "yes", by="alice")
        await agents.reject(engine, "no", by="bob", reason="fraud")
        assert await yes.result(timeout=10) == {"refund_id": "re_A1", "cents": 50_000}
        assert await no.result(timeout=10) == {
            "rejected": "rejected by bob: fraud",
            "by": "bob",
            "reason": "fraud",
        }
        assert (await small.result(timeout=10))["cents"] == 100
    assert sorted(e["order_id"] for e in tools.effects(effects)) == ["A1", "A3"]


@durably.workflow(name="approvals-gathered")
async def gathered_flow() -> Any:
    async def one(order_id: str, cents: int) -> Any:
        refunded = await tools.refund(order_id, cents)
        return [refunded, await tools.refund(order_id, 1)]  # a small one after: no approval

    return list(await asyncio.gather(one("A1", 50_000), one("A2", 60_000)))


async def test_direct_gated_calls_in_a_gather_replay_with_their_own_decisions(
    sqlite_url: str, effects: Path
) -> None:
    """Two branches each wait for a decision; the second is decided first, so its branch
    goes on first. Every decision is a park and a replay from the top, where each branch
    must meet its own entries (not the other's, as in the order of the first run)."""
    async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
        handle = await engine.start(gathered_flow, workflow_id="g")
        await until(handle, "waiting")
        pending = await agents.list_approvals(engine)
        assert sorted(p.arguments["order_id"] for p in pending) == ["A1", "A2"]
        second = next(p for p in pending if p.arguments["order_id"] == "A2")
        await agents.approve(engine, "g", by="alice", expect=second)
        await until(handle, "waiting")
        for _ in range(100):  # A2's branch goes on to its small refund before it parks again
            if len(tools.effects(effects)) == 2:
                break
            await asyncio.sleep(0.05)
        left = await agents.list_approvals(engine)
        assert [p.arguments["order_id"] for p in left] == ["A1"], left
        await agents.approve(engine, "g", by="alice")
        assert await handle.result(timeout=10) == [
            [{"refund_id": "re_A1", "cents": 50_000}, {"refund_id": "re_A1", "cents": 1}],
            [{"refund_id": "re_A2", "cents": 60_000}, {"refund_id": "re_A2", "cents": 1}],
        ]
        info = await engine.get_workflow("g")
    done = [(e["order_id"], e["cents"]) for e in tools.effects(effects)]
    assert done == [("A2", 60_000), ("A2", 1), ("A1", 50_000), ("A1", 1)]
    assert len({e["key"] for e in tools.effects(effects)}) == 4
    assert info.warnings is None


# --- across processes ----------------------------------------------------------------------


def _decide_cli(db: Path, *args: str) -> Any:
    argv = ["-m", "durably.agents", "--database", f"sqlite:///{db}", *args]
    return harness.run(argv, harness.child_env("", Path("/dev/null")))


def test_approve_from_another_process_then_restart(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn([REFUND, text("Refunded.")]), log_path=log) as server:
        env = harness.child_env(server.url, effects)
        parked = harness.runner(db, "x-1", "refund A1", env, "--until", "waiting")
        assert parked == {"status": "waiting"}
        with durably.Client(f"sqlite:///{db}") as client:
            assert client.get_workflow("x-1").status == "waiting"
            [pending] = agents.list_approvals(client)
        assert pending.arguments == {"order_id": "A1", "cents": 50_000}
        listed = _decide_cli(db, "approvals", "--json")
        assert json.loads(listed.stdout)["tool_call_id"] == "call_r"
        first = _decide_cli(db, "approve", "x-1", "--by", "alice", "--expect", pending.args_sha256)
        assert first.returncode == 0, first.stderr
        again = _decide_cli(db, "approve", "x-1", "--by", "mallory")
        assert again.returncode == 1 and "already decided" in again.stderr
        assert tools.effects(effects) == []
        done = harness.runner(db, "x-1", "refund A1", env)
    assert done["status"] == "completed" and done["result"]["output"] == "Refunded."
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["order_id"], ran["cents"]) == ("refund", "A1", 50_000)
    assert [r["turn"] for r in read_log(log)] == [0, 1]


def test_reject_from_another_process_tells_the_model(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn([REFUND, text("Sorry.")]), log_path=log) as server:
        env = harness.child_env(server.url, effects)
        assert harness.runner(db, "x-2", "refund A1", env, "--until", "waiting")
        code = (
            "import durably, durably.agents as a, sys\n"
            f"with durably.Client('sqlite:///{db}') as c:\n"
            "    a.reject(c, 'x-2', by='bob', reason='too large')\n"
        )
        rejected = harness.run(["-c", code], env)
        assert rejected.returncode == 0, rejected.stderr
        done = harness.runner(db, "x-2", "refund A1", env)
    assert done["result"]["output"] == "Sorry."
    assert tools.effects(effects) == []
    last = read_log(log)[-1]["body"]["messages"]
    assert last[-1] == {
        "role": "tool",
        "tool_call_id": "call_r",
        "content": '{"error": "rejected by bob: too large"}',
    }


async def test_cancelling_an_agent_that_waits_for_approval(sqlite_url: str, effects: Path) -> None:
    turn = tool_calls(
        call("lookup_order", {"order_id": "A1"}, id="c1"),
        call("refund", {"order_id": "A1", "cents": 20_000}, id="c2"),
    )
    async with live(sqlite_url, [turn, text("never")], [tools.lookup_order, tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        await s.engine.cancel("wf")
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=10)
        assert await handle.status() == "cancelled"
        assert len(s.server.requests) == 1
    assert [e["kind"] for e in tools.effects(effects)] == ["lookup"]


def test_the_command_line_says_what_was_decided_and_with_which_arguments(
    tmp_path: Path,
) -> None:
    """``durably reject`` says "rejected"; ``approve --args`` echoes the arguments that run."""
    db, effects = tmp_path / "agent.db", tmp_path / "effects.jsonl"
    script = by_turn([REFUND, text("Done.")])
    with FakeModelServer(script) as server:
        env = harness.child_env(server.url, effects)
        assert harness.runner(db, "cli-r", "refund A1", env, "--until", "waiting")
        rejected = _decide_cli(db, "reject", "cli-r", "--by", "bob", "--reason", "no")
        assert rejected.returncode == 0, rejected.stderr
        assert rejected.stdout.startswith("rejected refund("), rejected.stdout
        assert "rejectd" not in rejected.stdout

        assert harness.runner(db, "cli-a", "refund A1", env, "--until", "waiting")
        changed = '{"order_id": "A1", "cents": 1000}'
        approved = _decide_cli(db, "approve", "cli-a", "--by", "alice", "--args", changed)
        assert approved.returncode == 0, approved.stderr
        said = approved.stdout
        assert said.startswith("approved refund(order_id='A1', cents=1000)"), said
        assert "50000" not in said.split(" in cli-a")[0]
        assert "requested refund(order_id='A1', cents=50000)" in said, said
        done = harness.runner(db, "cli-a", "refund A1", env)
    assert done["status"] == "completed", done
    assert [(e["order_id"], e["cents"]) for e in tools.effects(effects)] == [("A1", 1000)]
