"""DurableRunner beyond function tools: MCP servers, a hand-built Handoff, run_streamed.

The real ``agents`` package against the fake model server (chat completions),
a real MCP server as a stdio subprocess that logs every ``tools/list`` and
``tools/call``, SIGKILL in real child processes on a real SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools
from tests.integkit import oai_flows, oai_more_flows

FLOWS = "tests.integkit.oai_more_flows"


def _runner(db: Path, workflow: str, wid: str, env: dict[str, str]) -> Any:
    argv = ["-m", "tests.integkit.runner", "--flows", FLOWS, "--workflow", workflow]
    argv += ["--db", str(db), "--id", wid, "--input", "orders?"]
    done = harness.run(argv, env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mcp_log(path: Path) -> list[dict[str, Any]]:
    return read_log(path)


SHIP_TWO = [
    tool_calls(call("ship_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("ship_order", {"order_id": "A2"}, id="call_2")),
    text("Both orders shipped."),
]


def test_mcp_calls_are_steps_and_none_repeats_after_a_kill(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "oai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    mcp_log = tmp_path / "mcp.jsonl"
    extra = {oai_more_flows.MCP_LOG_ENV: str(mcp_log)}
    with FakeModelServer(by_turn(SHIP_TWO), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:ship_order:call_2", **extra}
        killed = _runner(db, "mcp_orders", "m-1", harness.child_env(server.url, effects, crash))
        assert killed is None, "the first process should have been SIGKILLed"
        calls = [(r["tool"], r["order_id"]) for r in _mcp_log(mcp_log) if "tool" in r]
        assert calls == [("ship_order", "A1"), ("ship_order", "A2")]
        listed_before = [r for r in _mcp_log(mcp_log) if r["method"] == "tools/list"]
        assert len(listed_before) == 2  # one listing per turn so far
        done = _runner(db, "mcp_orders", "m-1", harness.child_env(server.url, effects, extra))

    assert done["status"] == "completed", done
    assert done["result"]["output"] == "Both orders shipped."
    mcp = _mcp_log(mcp_log)
    calls = [(r["tool"], r["order_id"]) for r in mcp if r["method"] == "tools/call"]
    assert calls == [("ship_order", "A1"), ("ship_order", "A2")]  # no completed call repeats
    assert len([r for r in mcp if r["method"] == "tools/list"]) == 3  # only the third turn's anew
    assert len({r["pid"] for r in mcp}) == 2  # the server was a new process after the kill
    assert [r["turn"] for r in read_log(log)] == [0, 1, 2]  # no completed turn asked again
    # the model saw the MCP tools, and each tool output came back (from the journal too)
    last = read_log(log)[-1]["body"]
    assert {t["function"]["name"] for t in last["tools"]} == {"ship_order", "order_status"}
    outputs = [json.dumps(m["content"]) for m in last["messages"] if m["role"] == "tool"]
    assert len(outputs) == 2
    assert "shipped A1" in outputs[0] and "shipped A2" in outputs[1]


async def test_mcp_listings_and_calls_are_journaled_and_a_replay_asks_no_server(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp_log = tmp_path / "mcp.jsonl"
    monkeypatch.setenv(oai_more_flows.MCP_LOG_ENV, str(mcp_log))
    with FakeModelServer(by_turn(SHIP_TWO)) as server:
        oai_flows.client.base_url = server.url
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_more_flows.mcp_orders, "ship", workflow_id="wf")
            result = await handle.result(timeout=30)
            history = await engine.history("wf")
            live = len(_mcp_log(mcp_log))
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=30)
        assert len(server.requests) == 3  # the replay made no model request
    assert result["output"] == replayed["output"] == "Both orders shipped."
    assert [e.name for e in history] == [
        "mcp:orders:list_tools",
        "llm:openai_agents",
        "tool:ship_order:call_1",
        "mcp:orders:list_tools",
        "llm:openai_agents",
        "tool:ship_order:call_2",
        "mcp:orders:list_tools",
        "llm:openai_agents",
    ]
    assert live == 5 and len(_mcp_log(mcp_log)) == live  # 3 listings + 2 calls; replay: none


async def test_an_mcp_server_requiring_approval_parks_and_calls_once_approved(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp_log = tmp_path / "mcp.jsonl"
    monkeypatch.setenv(oai_more_flows.MCP_LOG_ENV, str(mcp_log))
    with FakeModelServer(by_turn([SHIP_TWO[0], text("Shipped.")])) as server:
        oai_flows.client.base_url = server.url
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_more_flows.mcp_gated, "ship A1", workflow_id="wf")
            await _until(handle, "waiting")
            assert [r for r in _mcp_log(mcp_log) if r["method"] == "tools/call"] == []
            [pending] = await agents.list_approvals(engine)
            assert (pending.tool, pending.tool_call_id) == ("ship_order", "call_1")
            assert pending.arguments == {"order_id": "A1"}
            await agents.approve(engine, "wf", by="alice", expect=pending)
            result = await handle.result(timeout=30)
    assert result["output"] == "Shipped."
    calls = [(r["tool"], r["order_id"]) for r in _mcp_log(mcp_log) if r["method"] == "tools/call"]
    assert calls == [("ship_order", "A1")]


HANDOFF = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("escalate_to_billing", {}, id="call_h")),
    text("Billing here: refund on its way."),
]


def test_a_hand_built_handoff_is_invoked_once_across_a_kill(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "oai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(HANDOFF), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:handoff:escalate_to_billing"}
        killed = _runner(db, "hand_built", "h-1", harness.child_env(server.url, effects, crash))
        assert killed is None, "the first process should have been SIGKILLed"
        assert [e["kind"] for e in tools.effects(effects)] == ["lookup", "handoff"]
        done = _runner(db, "hand_built", "h-1", harness.child_env(server.url, effects))

    assert done["status"] == "completed", done
    assert done["result"]["last_agent"] == "billing"  # the replay handed off again
    assert done["result"]["output"] == "Billing here: refund on its way."
    ran = tools.effects(effects)
    assert [e["kind"] for e in ran] == ["lookup", "handoff"]  # on_invoke_handoff ran once
    assert [r["turn"] for r in read_log(log)] == [0, 1, 2]


async def test_a_hand_built_handoff_whose_target_is_unknown_is_refused_before_the_run(
    sqlite_url: str,
) -> None:
    with FakeModelServer(by_turn(HANDOFF)) as server:
        oai_flows.client.base_url = server.url
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_more_flows.hand_built_unknown, "x", workflow_id="wf")
            with pytest.raises(
                durably.DefinitionError,
                match=r"handoff 'escalate_to_billing': no agent named 'billing'.*handoff_agents",
            ):
                await handle.result(timeout=20)
        assert server.requests == []  # refused before anything was asked


STREAM = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    text("Your order A1 has shipped and should arrive on Tuesday, before noon."),
]


async def _until(handle: durably.WorkflowHandle[Any], status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (now := await handle.status()) != status:
        assert now in ("pending", "running"), now
        assert asyncio.get_running_loop().time() < deadline, f"never {status}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("flow", ["streamed", "streamed_responses"])
async def test_run_streamed_streams_live_and_a_replay_yields_each_turn_once(
    flow: str, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(harness.EFFECTS_ENV, str(tmp_path / "effects.jsonl"))
    with FakeModelServer(by_turn(STREAM)) as server:
        oai_flows.client.base_url = server.url
        oai_more_flows.STREAMED.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            workflow = getattr(oai_more_flows, flow)
            handle = await engine.start(workflow, "where?", workflow_id="wf")
            await _until(handle, "waiting")
        live = list(oai_more_flows.STREAMED)
        oai_more_flows.STREAMED.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            await engine.send_signal("wf", "go")
            result = await engine.handle("wf").result(timeout=20)
            history = await engine.history("wf")
        replayed = list(oai_more_flows.STREAMED)
        assert [r["stream"] for r in server.requests] == [True, True]  # the replay asked nothing
        paths = {r["path"] for r in server.requests}
    assert paths == {"/v1/responses" if flow == "streamed_responses" else "/v1/chat/completions"}

    answer = STREAM[1].content
    deltas = [e["delta"] for e in live if "delta" in e]
    assert len(deltas) > 3 and "".join(deltas) == answer  # in pieces, live
    assert [e["completed"] for e in live if "completed" in e] == ["live", "live"]
    assert replayed == [{"completed": "replayed"}, {"completed": "replayed"}]  # each turn once
    assert result["output"] == answer and result["last_agent"] == "support"
    assert (result["billed"]["calls"], result["replayed"]["calls"]) == (0, 2)
    assert [e.name for e in history if e.kind == "step"] == [
        "llm:openai_agents",
        "tool:lookup_order:call_1",
        "llm:openai_agents",
    ]
    assert [e["order_id"] for e in tools.effects(tmp_path / "effects.jsonl")] == ["A1"]


LOOKUP_THEN_ANSWER = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    text("A1 has shipped."),
]


def _session_items(path: Path) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT message_data FROM agent_messages ORDER BY id").fetchall()
    return [json.loads(data) for (data,) in rows]


def _shape(item: dict[str, Any]) -> str:
    return str(item.get("role") or item.get("type"))


def test_a_session_holds_each_item_once_after_a_kill(tmp_path: Path) -> None:
    """The SDK adds a run's items to its session as it goes: a recovery that ran the
    additions again would hold the question twice, and ask the model with it twice."""
    db, effects, log = tmp_path / "oai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    conversation = tmp_path / "conversation.db"
    extra = {oai_more_flows.SESSION_DB_ENV: str(conversation)}
    with FakeModelServer(by_turn(LOOKUP_THEN_ANSWER), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:call_1", **extra}
        env = harness.child_env(server.url, effects, crash)
        assert _runner(db, "session_orders", "s-1", env) is None  # SIGKILLed
        stored = len(_session_items(conversation))
        done = _runner(db, "session_orders", "s-1", harness.child_env(server.url, effects, extra))
        bodies = [r["body"] for r in read_log(log)]
    assert done is not None and done["result"]["output"] == "A1 has shipped.", done
    items = _session_items(conversation)
    assert [_shape(i) for i in items] == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
    ], (stored, items)
    assert len(bodies) == 2  # the first turn was replayed, not asked again
    asked = [m.get("role") for m in bodies[-1]["messages"]]
    assert asked.count("user") == 1, bodies[-1]["messages"]


async def test_a_session_kept_on_openais_side_is_refused_before_the_run(sqlite_url: str) -> None:
    with FakeModelServer(by_turn(LOOKUP_THEN_ANSWER)) as server:
        oai_flows.client.base_url = server.url
        async with durably.Engine(sqlite_url) as engine:
            handle = await engine.start(oai_more_flows.conversations_session, "x", workflow_id="wf")
            with pytest.raises(durably.DefinitionError, match="OpenAIConversationsSession"):
                await handle.result(timeout=20)
        assert server.requests == []


def test_guardrails_run_once_across_a_kill(tmp_path: Path) -> None:
    """A guardrail is code of its own (often a model call): it runs as a step, so a
    recovery reads what it decided instead of asking again."""
    db, effects, log = tmp_path / "oai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(LOOKUP_THEN_ANSWER), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:call_1"}
        env = harness.child_env(server.url, effects, crash)
        assert _runner(db, "guarded_orders", "g-1", env) is None  # SIGKILLed
        done = _runner(db, "guarded_orders", "g-1", harness.child_env(server.url, effects))
    assert done is not None and done["result"]["output"] == "A1 has shipped.", done
    assert done["result"]["screened"] == [{"checked": "orders?"}]
    ran = [e["kind"] for e in tools.effects(effects)]
    assert ran.count("screen_question") == 1, ran
    assert ran.count("screen_answer") == 1 and ran.count("lookup") == 1, ran


async def test_a_tripped_guardrail_fails_the_run_once_decided(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(effects))
    with FakeModelServer(by_turn(LOOKUP_THEN_ANSWER)) as server:
        oai_flows.client.base_url = server.url
        async with durably.Engine(sqlite_url) as engine:
            handle = await engine.start(
                oai_more_flows.guarded_orders, "refund A1", workflow_id="wf"
            )
            with pytest.raises(durably.StepError, match="InputGuardrailTripwireTriggered"):
                await handle.result(timeout=20)
            assert await handle.status() == "failed"
            history = await engine.history("wf")
    assert [e.name for e in history if e.name.startswith("guardrail:")] == [
        "guardrail:input:screen_question"
    ]
    assert [e["kind"] for e in tools.effects(effects)] == ["screen_question"]
