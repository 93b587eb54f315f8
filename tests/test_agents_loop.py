"""The agent loop in one process: turns and tools as steps, errors, streaming, sync clients."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

import durably
from durably import agents
from durably.agents import usage as usage_module
from durably.testing.models import FakeModelServer, by_turn, call, text, tool_calls
from tests.agentkit import harness, tools
from tests.agentkit import live as live_module
from tests.agentkit.live import live, until
from tests.agentkit.rawclient import RawClient


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


@agents.tool
async def find(order_id: str) -> dict[str, Any]:
    """Find an order."""
    if order_id == "missing":
        raise agents.ToolError(f"no order {order_id}")
    if order_id == "boom":
        raise RuntimeError("the database is on fire")
    return {"order_id": order_id}


LOOKUP = tool_calls(call("lookup_order", {"order_id": "A1"}, id="c1"))


async def test_each_turn_and_each_tool_call_is_a_step(sqlite_url: str, effects: Path) -> None:
    async with live(sqlite_url, [LOOKUP, text("Shipped.")], [tools.lookup_order]) as s:
        result = await s.run("Where is A1?")
        history = await s.engine.history("wf")
        requests = s.server.requests
    assert (result["output"], result["turns"], result["tool_calls"]) == ("Shipped.", 2, 1)
    assert [(e.kind, e.name) for e in history] == [
        ("step", "llm:chat.completions"),
        ("step", "tool:lookup_order:c1"),
        ("step", "llm:chat.completions"),
    ]
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "tool", "assistant"]
    first = requests[0]["body"]
    assert first["model"] == "gpt-4.1-mini"
    assert first["tools"][0]["function"]["name"] == "lookup_order"
    assert first["tools"][0]["function"]["description"] == "Look up an order's status."
    # every journaled turn holds the response only, never the messages that were sent
    assert all("messages" not in (e.payload or "") for e in history)
    assert requests[0]["idempotency_key"] == "wf:1" and requests[1]["idempotency_key"] == "wf:3"
    assert len(tools.effects(effects)) == 1


async def test_tool_errors_and_bad_calls_reach_the_model(sqlite_url: str) -> None:
    turn = tool_calls(
        call("find", {"order_id": "missing"}, id="e1"),
        call("find", {"order_id": 7}, id="e2"),
        call("find", "{not json", id="e3"),
        call("nope", {}, id="e4"),
        call("find", {"order_id": "A1", "extra": 1}, id="e5"),
        call("find", {"order_id": "A2"}, id="e6"),
    )
    async with live(sqlite_url, [turn, text("ok")], [find]) as s:
        await s.run()
        contents = [m["content"] for m in s.tool_messages()]
    errors = [json.loads(c).get("error", "") for c in contents[:5]]
    assert errors[0] == "no order missing"
    assert errors[1].startswith("find: invalid arguments: order_id")
    assert ("find:" in errors[2] and "JSON" in errors[2]) or "Expecting" in errors[2]
    assert errors[3] == "unknown tool 'nope' (tools: find)"
    assert "extra" in errors[4]
    assert json.loads(contents[5]) == {"order_id": "A2"}


REFUSALS: list[str] = []  # every run of refund_refused's body


@agents.tool(retry=durably.Retry(max_attempts=3, initial=0.0))
async def refund_refused(order_id: str) -> str:
    """Refund an order (a side effect; this one is refused by the payments service)."""
    REFUSALS.append(order_id)
    raise agents.ToolError(f"order {order_id} is not refundable")


async def test_a_tool_error_is_the_tools_answer_and_never_retried(sqlite_url: str) -> None:
    """ToolError is what the model reads back, not a failure to try again: a tool with
    ``retry=`` that raises it ran its body (and its side effect) once, not three times."""
    REFUSALS.clear()
    turn = tool_calls(call("refund_refused", {"order_id": "A1"}, id="r1"))
    async with live(sqlite_url, [turn, text("sorry")], [refund_refused]) as s:
        await s.run()
        contents = [m["content"] for m in s.tool_messages()]
        with pytest.raises(agents.ToolError, match="not refundable"):
            await (await s.engine.start(refund_directly, workflow_id="direct")).result(10)
    assert json.loads(contents[0]) == {"error": "order A1 is not refundable"}
    assert REFUSALS == ["A1", "B2"]  # once each: from the model's call and a direct one


@durably.workflow
async def refund_directly() -> str:
    return await refund_refused("B2")


async def test_an_unexpected_tool_exception_fails_the_workflow(sqlite_url: str) -> None:
    turn = tool_calls(call("find", {"order_id": "boom"}))
    async with live(sqlite_url, [turn, text("never")], [find]) as s:
        handle = await s.start()
        with pytest.raises(RuntimeError, match="on fire"):
            await handle.result(timeout=10)
        assert await handle.status() == "failed"
        assert len(s.server.requests) == 1


async def test_max_turns_stops_a_model_that_never_answers(sqlite_url: str) -> None:
    forever = by_turn([tool_calls(call("find", {"order_id": f"A{i}"})) for i in range(10)])
    async with live(sqlite_url, forever, [find], max_turns=3) as s:
        with pytest.raises(agents.MaxTurnsExceeded, match="3 model calls"):
            await (await s.start()).result(timeout=10)
        assert len(s.server.requests) == 3


@pytest.mark.parametrize("client", ["async", "sync"], ids=["AsyncOpenAI", "OpenAI"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_sync_and_async_clients_whole_or_streamed(
    sqlite_url: str, effects: Path, client: str, stream: bool
) -> None:
    replies = [LOOKUP, text("A1 has shipped, all good.")]
    async with live(sqlite_url, replies, [tools.lookup_order], client=client, stream=stream) as s:
        result = await s.run()
        assert [r["stream"] for r in s.server.requests] == [stream, stream]
        served = [r["usage"] for r in s.server.requests]
    assert result["output"] == "A1 has shipped, all good."
    assert result["messages"][1]["tool_calls"][0]["function"] == {
        "name": "lookup_order",
        "arguments": '{"order_id": "A1"}',
    }
    billed = result["usage"]["billed"]
    assert billed["calls"] == 2
    assert billed["prompt_tokens"] == sum(u["prompt_tokens"] for u in served)
    assert billed["completion_tokens"] == sum(u["completion_tokens"] for u in served)


async def test_usage_is_split_into_billed_and_replayed_and_priced(
    sqlite_url: str, effects: Path
) -> None:
    """A park (waiting for approval) replays the earlier turns from the journal."""
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 100_000, "cached_tokens": 400_000}
    replies = [
        tool_calls(call("lookup_order", {"order_id": "A1"}), usage=usage),
        tool_calls(call("refund", {"order_id": "A1", "cents": 99_999}, id="r"), usage=usage),
        text("Refunded.", usage={"prompt_tokens": 10, "completion_tokens": 5}),
    ]
    prices = {"gpt-4.1-mini": agents.Price(input=1.0, output=10.0, cached_input=0.5)}
    async with live(
        sqlite_url, replies, [tools.lookup_order, tools.refund], price_table=prices
    ) as s:
        handle = await s.start()
        await until(handle, "waiting")
        await agents.approve(s.engine, "wf", by="alice")
        result = await handle.result(timeout=10)
        assert [r["turn"] for r in s.server.requests] == [0, 1, 2]
    replayed, billed = result["usage"]["replayed"], result["usage"]["billed"]
    per_call = 0.6 * 1.0 + 0.4 * 0.5 + 0.1 * 10.0  # $ for one 1M-prompt/100k-completion call
    assert replayed["calls"] == 2 and replayed["prompt_tokens"] == 2_000_000
    assert replayed["cached_tokens"] == 800_000
    assert replayed["cost"] == pytest.approx(2 * per_call)
    assert (billed["calls"], billed["prompt_tokens"], billed["completion_tokens"]) == (1, 10, 5)
    assert result["summary"] == (
        "replayed 2 model calls (2,200,000 tokens, $3.60) from the journal instead of paying "
        "for them again; billed 1 model call (15 tokens, $0.0001)"
    )


async def test_a_long_conversation_grows_the_journal_linearly(sqlite_url: str) -> None:
    """200 turns: the journal holds what each turn added, never the whole conversation."""
    turns = 200

    def script(body: dict[str, Any]) -> Any:
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if n < turns - 1:
            return tool_calls(call("find", {"order_id": f"A{n}"}))
        return text("done")

    async with live(sqlite_url, script, [find], max_turns=turns, client="raw") as s:
        result = await s.run()
        history = await s.engine.history("wf")
        sent = sum(len(json.dumps(r["body"])) for r in s.server.requests)
    assert result["turns"] == turns
    per_turn: list[int] = []
    for entry in history:  # a turn is a model step followed by its tool step
        size = len(entry.payload or "")
        if entry.name.startswith("llm:"):
            per_turn.append(size)
        else:
            per_turn[-1] += size
    first, last = sum(per_turn[:50]) / 50, sum(per_turn[-51:-1]) / 50
    assert last < 2 * first, (first, last)
    journal = sum(per_turn)
    assert journal < sent / 20  # the requests grew quadratically; the journal did not


async def test_parallel_calls_take_seqs_in_the_models_order(sqlite_url: str, effects: Path) -> None:
    """They finish c, b, a; the journal and the next request keep a, b, c; a fork replays so."""
    turn = tool_calls(
        call("work", {"name": "a", "delay": 0.3}, id="a"),
        call("work", {"name": "b", "delay": 0.15}, id="b"),
        call("work", {"name": "c", "delay": 0.0}, id="c"),
    )
    async with live(sqlite_url, [turn, text("done")], [tools.work]) as s:
        await s.run()
        history = await s.engine.history("wf")
        fork = await s.engine.fork("wf", from_seq=len(history) - 1, workflow_id_new="fork")
        await fork.result(timeout=10)
        original, replayed = s.tool_messages(1), s.tool_messages(2)
    assert [e["name"] for e in tools.effects(effects)] == ["c", "b", "a"]
    assert [e.name for e in history[1:4]] == ["tool:work:a", "tool:work:b", "tool:work:c"]
    assert [m["tool_call_id"] for m in original] == ["a", "b", "c"]
    assert replayed == original
    assert len(tools.effects(effects)) == 3  # the fork ran no tool again


async def test_changing_the_tools_under_a_parked_agent_is_a_divergence(
    sqlite_url: str, effects: Path
) -> None:
    """The journal names each call by tool and id; a replay that skips one stops the workflow."""
    replies = [LOOKUP, tool_calls(call("refund", {"order_id": "A1", "cents": 50_000})), text("x")]
    async with live(sqlite_url, replies, [tools.lookup_order, tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        client = s.agent.client
        live_module.CURRENT[:] = [agents.Agent(client=client, model="m", tools=[tools.refund])]
        await agents.approve(s.engine, "wf", by="alice")
        with pytest.raises(durably.NonDeterminismError, match="tool:lookup_order:c1"):
            await handle.result(timeout=10)
        assert await handle.status() == "diverged"


async def test_outside_a_workflow_the_agent_runs_plainly_for_unit_tests(effects: Path) -> None:
    with FakeModelServer(by_turn([LOOKUP, text("Shipped.")])) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            agent = agents.Agent(client=client, model="gpt-4.1-mini", tools=[tools.lookup_order])
            result = await agent.run("Where is A1?")
    assert (result.output, result.turns, result.tool_calls) == ("Shipped.", 2, 1)
    assert result.usage.billed.calls == 2 and result.usage.replayed.calls == 0
    assert server.requests[0]["idempotency_key"] is None  # no step, no key


async def test_usage_can_be_read_back_from_a_journal(sqlite_url: str) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 50}
    replies = [tool_calls(call("find", {"order_id": "A1"}), usage=usage), text("ok", usage=usage)]
    async with live(sqlite_url, replies, [find]) as s:
        await s.run()
        history = await s.engine.history("wf")
    tokens = agents.usage_from_history(history)  # priced by the example table, gpt-4.1-mini
    assert (tokens.calls, tokens.prompt_tokens, tokens.cached_tokens) == (2, 200, 100)
    assert tokens.cost == pytest.approx(2 * (50 * 0.40 + 50 * 0.10 + 10 * 1.60) / 1e6)
    assert agents.usage_from_history(history, {}).unpriced_calls == 2


def test_prices_match_dated_model_names_by_the_longest_prefix() -> None:
    table = agents.DEFAULT_PRICES
    assert usage_module.price_for("gpt-4.1-mini-2025-04-14", table) == table["gpt-4.1-mini"]
    assert usage_module.price_for("gpt-4o-2024-08-06", table) == table["gpt-4o"]
    assert usage_module.price_for("llama-3", table) is None
    with pytest.raises(durably.DefinitionError):
        agents.ModelRetry(max_retry_after=-1)


def test_a_conversation_can_be_continued_without_repeating_the_instructions() -> None:
    agent = agents.Agent(
        client=RawClient("http://127.0.0.1:9/v1"), model="m", instructions="Be kind."
    )
    first = agent.initial_messages("hi")
    assert first == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
    later = agent.initial_messages([*first, {"role": "user", "content": "and then?"}])
    assert [m["role"] for m in later] == ["system", "user", "user"]
