"""Pydantic AI MCP servers under DurableAgent: tool listings and tool calls are steps.

A real MCP server (tests/integkit/mcp_orders.py, a stdio subprocess reached
through Pydantic AI's ``MCPToolset``) logs every ``tools/list`` and
``tools/call``; the model is the fake server's, with the real openai client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness
from tests.integkit import pai_mcp_flows

SHIP_TWO = [
    tool_calls(call("ship_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("ship_order", {"order_id": "A2"}, id="call_2")),
    text("Both orders shipped."),
]


def _runner(db: Path, wid: str, env: dict[str, str]) -> Any:
    argv = ["-m", "tests.integkit.runner", "--flows", "tests.integkit.pai_mcp_flows"]
    argv += ["--workflow", "ship", "--db", str(db), "--id", wid, "--input", "ship A1 and A2"]
    done = harness.run(argv, env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _calls(mcp_log: Path) -> list[tuple[str, str]]:
    return [(r["tool"], r["order_id"]) for r in read_log(mcp_log) if r["method"] == "tools/call"]


def test_no_completed_mcp_call_repeats_after_a_kill(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "pai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    mcp_log = tmp_path / "mcp.jsonl"
    extra = {pai_mcp_flows.MCP_LOG_ENV: str(mcp_log)}
    with FakeModelServer(by_turn(SHIP_TWO), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:ship_order:call_2", **extra}
        killed = _runner(db, "p-1", harness.child_env(server.url, effects, crash))
        assert killed is None, "the first process should have been SIGKILLed"
        assert _calls(mcp_log) == [("ship_order", "A1"), ("ship_order", "A2")]
        done = _runner(db, "p-1", harness.child_env(server.url, effects, extra))

    assert done["status"] == "completed", done
    assert done["result"]["output"] == "Both orders shipped."
    assert _calls(mcp_log) == [("ship_order", "A1"), ("ship_order", "A2")]  # none made again
    assert len({r["pid"] for r in read_log(mcp_log)}) == 2  # a new server after the kill
    requests = read_log(log)
    assert [r["turn"] for r in requests] == [0, 1, 2]  # no completed turn asked again
    assert {t["function"]["name"] for t in requests[-1]["body"]["tools"]} == {
        "ship_order",
        "order_status",
    }
    results = [m["content"] for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert results == ["shipped A1", "shipped A2"]  # the journaled results were sent back
    assert done["result"]["replayed"]["calls"] == 2 and done["result"]["billed"]["calls"] == 1


async def test_listings_and_calls_are_steps_and_a_replay_asks_no_server(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp_log = tmp_path / "mcp.jsonl"
    monkeypatch.setattr(pai_mcp_flows, "DURABLE", [pai_mcp_flows.build(str(mcp_log))])
    with FakeModelServer(by_turn(SHIP_TWO)) as server:
        pai_mcp_flows.client.base_url = server.url
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_mcp_flows.ship, "ship", workflow_id="wf")
            result = await handle.result(timeout=30)
            history = await engine.history("wf")
            live = read_log(mcp_log)
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=30)
        assert len(server.requests) == 3  # the replay made no model request
    assert result["output"] == replayed["output"] == "Both orders shipped."
    assert [e.name for e in history] == [
        "mcp:orders:list_tools",
        "llm:pydantic_ai",
        "tool:ship_order:call_1",
        "mcp:orders:list_tools",
        "llm:pydantic_ai",
        "tool:ship_order:call_2",
        "mcp:orders:list_tools",
        "llm:pydantic_ai",
    ]
    assert [r["method"] for r in live] == ["tools/list", "tools/call", "tools/call"]
    assert read_log(mcp_log) == live  # the replay listed and called nothing
