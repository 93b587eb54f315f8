"""Anthropic's Messages API natively: ``Agent`` and ``durably.llm(AsyncAnthropic())``.

The real ``anthropic`` client against the fake model server's ``/v1/messages``;
SIGKILL in real child processes on a real SQLite file; both backends in process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools

LLM: list[agents.DurableLLM] = []
AGENT: list[agents.Agent] = []
PRICES = {
    "claude-sonnet-4": agents.Price(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
}


@agents.tool
async def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@durably.workflow(name="anthropic-agent")
async def agent_flow(question: str) -> dict[str, Any]:
    result = await AGENT[0].run(question)
    await durably.wait_for_signal("go")
    return {
        "output": result.output,
        "messages": result.messages,
        "billed": result.usage.billed.calls,
        "replayed": result.usage.replayed.calls,
        "cost": result.usage.total.cost,
    }


@durably.workflow(name="anthropic-llm")
async def llm_flow() -> dict[str, Any]:
    reply = await LLM[0].messages.create(
        model="claude-sonnet-4-6",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello"}],
    )
    await durably.wait_for_signal("go")
    return {
        "type": type(reply).__name__,
        "text": reply.content[0].text,
        "stop_reason": reply.stop_reason,
        "usage": reply.usage.model_dump(),
        "replayed": agents.run_usage().replayed.calls,
    }


async def _park_then_finish(url: str, wf: Any, *args: Any) -> Any:
    """Run until parked on "go", stop the engine, finish in a new one: a replay from the top."""
    async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
        handle = await engine.start(wf, *args, workflow_id="wf")
        deadline = asyncio.get_running_loop().time() + 15
        while (status := await handle.status()) != "waiting":
            if status not in ("pending", "running"):
                raise AssertionError(f"{status}: {(await engine.get_workflow('wf')).error}")
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
    async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
        await engine.send_signal("wf", "go")
        return await engine.handle("wf").result(timeout=15)


USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 100,
    "cached_tokens": 600,
    "cache_write_tokens": 300,
}


async def test_an_agent_over_the_messages_api(store_url: str) -> None:
    script = by_turn(
        [
            tool_calls(
                call("lookup", {"order_id": "A1"}, id="toolu_1"),
                content="Let me look.",
                usage=USAGE,
            ),
            text("A1 has shipped.", usage=USAGE),
        ]
    )
    with FakeModelServer(script) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        AGENT[:] = [
            agents.Agent(
                client=client,
                model="claude-sonnet-4-6",
                instructions="You are a support agent.",
                tools=[lookup],
                price_table=PRICES,
            )
        ]
        result = await _park_then_finish(store_url, agent_flow, "Where is A1?")
        await client.close()
        requests = [r["body"] for r in server.requests]
        paths = {r["path"] for r in server.requests}
    assert paths == {"/v1/messages"}
    assert len(requests) == 2  # the replay asked nothing
    assert result["output"] == "A1 has shipped."
    assert (result["billed"], result["replayed"]) == (0, 2)
    first, second = requests
    assert first["system"] == "You are a support agent."
    assert first["max_tokens"] == 4096
    assert first["tools"][0]["name"] == "lookup" and "input_schema" in first["tools"][0]
    assert first["messages"] == [{"role": "user", "content": "Where is A1?"}]
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order_id": "A1"}},
        ],
    }
    [result_block] = second["messages"][2]["content"]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_1"
    assert json.loads(result_block["content"]) == {"order_id": "A1", "status": "shipped"}
    # 100 fresh input tokens, 600 read from the cache, 300 written to it, 100 output
    per_call = (100 * 3.0 + 600 * 0.3 + 300 * 3.75 + 100 * 15.0) / 1_000_000
    assert result["cost"] == pytest.approx(2 * per_call)


async def test_the_journal_holds_a_provider_neutral_turn(sqlite_url: str) -> None:
    with FakeModelServer([text("hi", usage=USAGE)]) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        LLM[:] = [agents.llm(client)]
        result = await _park_then_finish(sqlite_url, llm_flow)
        await client.close()
        assert len(server.requests) == 1
        async with durably.Engine(sqlite_url) as engine:
            history = await engine.history("wf")
    assert result["type"] == Message.__name__ and result["text"] == "hi"
    assert result["stop_reason"] == "end_turn" and result["replayed"] == 1
    assert result["usage"]["input_tokens"] == 100
    assert result["usage"]["cache_read_input_tokens"] == 600
    assert result["usage"]["cache_creation_input_tokens"] == 300
    [turn] = [e for e in history if e.name == "llm:chat.completions"]
    record = json.loads(turn.payload or "")
    assert record["provider"] == "anthropic"
    assert record["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert record["choices"][0]["finish_reason"] == "stop" and record["stop_reason"] == "end_turn"
    assert record["usage"]["prompt_tokens"] == 1000
    assert record["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 600,
        "cache_write_tokens": 300,
    }


async def test_a_provider_error_from_anthropic_replays_as_itself(sqlite_url: str) -> None:
    from durably.testing.models import failure

    with FakeModelServer([failure(400, message="max_tokens: too large")]) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        LLM[:] = [agents.llm(client)]
        result = await _park_then_finish(sqlite_url, error_flow)
        await client.close()
        assert len(server.requests) == 1
    assert result == {"type": "BadRequestError", "status": 400, "kind": "invalid_request_error"}


@durably.workflow(name="anthropic-error")
async def error_flow() -> dict[str, Any]:
    try:
        await LLM[0].messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=[])
    except anthropic.BadRequestError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        seen = {
            "type": type(exc).__name__,
            "status": exc.status_code,
            "kind": (body.get("error") or {}).get("type"),
        }
    await durably.wait_for_signal("go")
    return seen


def _lookups(n: int) -> list[Any]:
    turns = [
        tool_calls(call("lookup_order", {"order_id": f"A{i}"}, id=f"toolu_{i}"))
        for i in range(1, n + 1)
    ]
    return [*turns, text(f"All {n} orders shipped.")]


def test_kill_after_the_second_tool_call_asks_no_completed_turn_again(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(_lookups(3)), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:toolu_2"}
        env = harness.child_env(server.url, effects, crash)
        assert harness.runner(db, "c-1", "orders?", env, "--flow", "anthropic") is None
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        env = harness.child_env(server.url, effects)
        done = harness.runner(db, "c-1", "orders?", env, "--flow", "anthropic")

    assert done["status"] == "completed", done
    result = done["result"]
    assert result["output"] == "All 3 orders shipped."
    requests = read_log(log)
    assert [r["turn"] for r in requests] == [0, 1, 2, 3]  # no completed turn asked again
    assert {r["path"] for r in requests} == {"/v1/messages"}
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2", "A3"]
    served = [r["usage"] for r in requests]
    assert result["replayed"]["calls"] == 2 and result["billed"]["calls"] == 2
    assert result["replayed"]["completion_tokens"] == sum(u["output_tokens"] for u in served[:2])
    assert result["billed"]["prompt_tokens"] == sum(
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        for u in served[2:]
    )
