"""Sub-agents: an agent used as a tool of another runs as a durable child workflow.

Its turns are journaled in its own workflow (``<parent>:agent:<tool_call_id>``),
its answer is the tool's result, and its usage rolls up into the parent's. After
a restart the parent replays without asking the child's model again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai

import durably
from durably import agents
from durably.testing.models import FakeModelServer, call, read_log, text, tool_calls
from tests.agentkit import harness, tools

AGENTS: list[agents.Agent] = []


@durably.workflow(name="subagents-parent")
async def parent_flow(question: str) -> dict[str, Any]:
    result = await AGENTS[0].run(question)
    await durably.wait_for_signal("go")
    return {
        "output": result.output,
        "billed": result.usage.billed.calls,
        "replayed": result.usage.replayed.calls,
        "tool_messages": [m for m in result.messages if m["role"] == "tool"],
    }


def _script(body: dict[str, Any]) -> Any:
    system = body["messages"][0]["content"]
    said = [m for m in body["messages"] if m["role"] == "assistant"]
    if system == "You research orders.":
        return text("A1 shipped on Monday.")
    if not said:
        return tool_calls(call("researcher", {"input": "When did A1 ship?"}, id="r1"))
    return text("Done: A1 shipped on Monday.")


def _support_agent(client: Any, **tool: Any) -> None:
    """The support agent (AGENTS[0]), with the researcher as its one tool."""
    researcher = agents.Agent(
        client=client,
        model="gpt-4.1-mini",
        instructions="You research orders.",
        name="researcher",
    )
    AGENTS[:] = [
        agents.Agent(
            client=client,
            model="gpt-4.1-mini",
            instructions="You are a support agent.",
            tools=[agents.as_tool(researcher, **tool)],
        )
    ]


async def test_a_sub_agent_runs_as_a_child_workflow_and_rolls_up(store_url: str) -> None:
    with FakeModelServer(_script) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            _support_agent(client, description="Ask the researcher.")
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                handle = await engine.start(parent_flow, "A1?", workflow_id="wf")
                deadline = asyncio.get_running_loop().time() + 15
                # "waiting" comes first while the parent waits for its child: wait for the
                # parent's last turn, after which it waits for the signal
                while (status := await handle.status()) != "waiting" or len(server.requests) < 3:
                    assert status in ("pending", "running", "waiting"), status
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                await engine.send_signal("wf", "go")
                result = await engine.handle("wf").result(timeout=15)
                child = await engine.get_workflow("wf:agent:r1")
                child_history = await engine.history("wf:agent:r1")
        assert len(server.requests) == 3  # parent, child, parent; the replay asked nothing
    assert result["output"] == "Done: A1 shipped on Monday."
    assert result["tool_messages"][0]["content"] == "A1 shipped on Monday."
    assert child.status == "completed" and child.parent_id == "wf"
    assert [e.name for e in child_history if e.name.startswith("llm:")] == ["llm:chat.completions"]
    assert (result["billed"], result["replayed"]) == (0, 3)  # the child's call rolled up


def _team(body: dict[str, Any]) -> Any:
    system = body["messages"][0]["content"]
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if system == "You research orders.":
        replies = [
            tool_calls(call("lookup_order", {"order_id": "A1"}, id="rc_1")),
            tool_calls(call("lookup_order", {"order_id": "A2"}, id="rc_2")),
            text("A1 and A2 shipped."),
        ]
        return replies[turn]
    if turn == 0:
        return tool_calls(call("researcher", {"input": "A1 and A2?"}, id="r1"))
    return text("Both orders shipped.")


def test_a_sub_agent_killed_mid_way_asks_no_completed_turn_again(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(_team, log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:rc_1"}
        env = harness.child_env(server.url, effects, crash)
        assert harness.runner(db, "t-1", "orders?", env, "--flow", "team") is None
        before = read_log(log)
        assert len(before) == 2  # the lead's first turn, the researcher's first turn
        done = harness.runner(
            db, "t-1", "orders?", harness.child_env(server.url, effects), "--flow", "team"
        )

    assert done["status"] == "completed", done
    result = done["result"]
    assert result["output"] == "Both orders shipped."
    requests = read_log(log)
    asked = [(r["body"]["messages"][0]["content"], r["turn"]) for r in requests]
    assert asked == [
        ("You lead the support team.", 0),
        ("You research orders.", 0),
        ("You research orders.", 1),  # the child's turn 0 was not asked again
        ("You research orders.", 2),
        ("You lead the support team.", 1),
    ]
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2"]
    total = result["billed"]["calls"] + result["replayed"]["calls"]
    assert total == 5  # the lead's 2 turns and the researcher's 3, rolled up
    assert result["replayed"]["calls"] == 2  # the lead's turn 0 and the researcher's turn 0


@durably.workflow(name="subagents-reused-ids")
async def reused_ids_flow(question: str) -> list[str]:
    result = await AGENTS[0].run(question)
    return [m["content"] for m in result.messages if m["role"] == "tool"]


def _reusing_script(body: dict[str, Any]) -> Any:
    """A provider that names every tool call ``call_0``: two questions, one id."""
    said = [m for m in body["messages"] if m["role"] == "assistant"]
    if body["messages"][0]["content"] == "You research orders.":
        return text("answer to " + body["messages"][-1]["content"])
    if len(said) < 2:
        question = ["When did A1 ship?", "When did B2 ship?"][len(said)]
        return tool_calls(call("researcher", {"input": question}, id="call_0"))
    return text("Done.")


async def test_a_reused_tool_call_id_still_asks_the_sub_agent_again(sqlite_url: str) -> None:
    """Each call runs its own child: a reused id must not join the earlier call's child."""
    with FakeModelServer(_reusing_script) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            _support_agent(client)
            async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
                handle = await engine.start(reused_ids_flow, "A1 and B2?", workflow_id="wf")
                answers = await handle.result(timeout=10)
        assert len(server.requests) == 5  # parent, child, parent, child, parent
    assert answers == ["answer to When did A1 ship?", "answer to When did B2 ship?"]


def test_a_sub_agents_lost_answer_counts_in_the_leads_usage(tmp_path: Path) -> None:
    """SIGKILL after the server answered the researcher's first turn, before its receipt:
    the researcher asks again, and the lead's usage (what its budget counts, and its
    summary) holds that lost request as its own calls' would."""
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(_team, log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_call:llm:chat.completions@2"}
        env = harness.child_env(server.url, effects, crash)
        assert harness.runner(db, "t-lost", "orders?", env, "--flow", "team") is None
        done = harness.runner(
            db, "t-lost", "orders?", harness.child_env(server.url, effects), "--flow", "team"
        )
        requests = read_log(log)
    assert done["status"] == "completed", done
    asked = [(r["body"]["messages"][0]["content"], r["turn"]) for r in requests]
    assert asked[:3] == [
        ("You lead the support team.", 0),
        ("You research orders.", 0),
        ("You research orders.", 0),  # its answer was lost: asked again
    ]
    summary = done["result"]["summary"]
    assert "1 earlier model request retried" in summary, summary
    assert "billed at least" in summary, summary
