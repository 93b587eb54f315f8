"""Pydantic AI made durable by wrapping: DurableAgent, with the real pydantic_ai package.

The agent talks to the fake model server with the real openai client through
Pydantic AI's OpenAIChatModel; tool effects are counted from a file, model
requests from the server's log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import agents, codec
from durably.integrations.pydantic_ai import DurableAgent
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools
from tests.agentkit.live import until
from tests.integkit import pai_flows

FLOWS = ["--flows", "tests.integkit.pai_flows"]
TWO_LOOKUPS = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("lookup_order", {"order_id": "A2"}, id="call_2")),
    text("Both orders shipped."),
]
REFUND = tool_calls(call("refund", {"order_id": "A1", "cents": 50_000}, id="call_r"))


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


def _serve(script: list[Any], log: Path | None = None) -> FakeModelServer:
    server = FakeModelServer(by_turn(script), log_path=log).start()
    pai_flows.client.base_url = server.url
    return server


def _runner(db: Path, wid: str, env: dict[str, str], *extra: str) -> Any:
    argv = ["-m", "tests.integkit.runner", *FLOWS, "--workflow", "support"]
    done = harness.run([*argv, "--db", str(db), "--id", wid, "--input", "orders?", *extra], env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kill_after_the_second_tool_call_asks_no_completed_turn_again(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "pai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(TWO_LOOKUPS), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:call_2"}
        killed = _runner(db, "pai-1", harness.child_env(server.url, effects, crash))
        assert killed is None, "the first process should have been SIGKILLed"
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        done = _runner(db, "pai-1", harness.child_env(server.url, effects))

    assert done["status"] == "completed", done
    result = done["result"]
    assert result["output"] == "Both orders shipped."
    requests = read_log(log)
    assert [r["turn"] for r in requests] == [0, 1, 2]  # each turn asked exactly once
    ran = tools.effects(effects)
    assert [e["order_id"] for e in ran] == ["A1", "A2"]  # each tool effect exactly once
    assert len({e["pid"] for e in ran}) == 1  # both ran before the kill
    served = [r["usage"] for r in requests]
    assert result["replayed"]["calls"] == 2
    assert result["replayed"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in served[:2])
    assert result["billed"]["calls"] == 1
    assert result["billed"]["prompt_tokens"] == served[2]["prompt_tokens"]
    # the last request was rebuilt from the journal: both tool results, by call id
    last = requests[-1]["body"]["messages"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_1", "call_2"]


async def test_one_step_per_turn_and_tool_call_and_a_replay_asks_nothing(
    store_url: str, effects: Path
) -> None:
    server = _serve(TWO_LOOKUPS)
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support, "orders?", workflow_id="wf")
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
            assert len(server.requests) == 3
            # a copy of the whole journal replays every turn and tool call: no request
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=20)
    finally:
        server.stop()
    assert [(e.kind, e.name) for e in history] == [
        ("step", "llm:pydantic_ai"),
        ("step", "tool:lookup_order:call_1"),
        ("step", "llm:pydantic_ai"),
        ("step", "tool:lookup_order:call_2"),
        ("step", "llm:pydantic_ai"),
    ]
    assert result["output"] == replayed["output"] == "Both orders shipped."
    assert len(server.requests) == 3  # the replay made no model request
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2"]
    assert (result["billed"]["calls"], result["replayed"]["calls"]) == (3, 0)
    assert (replayed["billed"]["calls"], replayed["replayed"]["calls"]) == (0, 3)
    # the journal holds Pydantic AI's own serialization of the response, not a class path
    first: Any = codec.decode(history[0].payload or "null", where="test")
    assert first["response"]["kind"] == "response"
    assert first["response"]["parts"][0]["tool_name"] == "lookup_order"
    assert "__durably_type__" not in (history[0].payload or "")
    assert agents.usage_from_history(history).calls == 3


async def test_a_tool_requiring_approval_parks_the_workflow_and_runs_once_approved(
    store_url: str, effects: Path
) -> None:
    server = _serve([REFUND, text("Refunded.")])
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support, "refund A1", workflow_id="wf")
            await until(handle, "waiting")
            assert tools.effects(effects) == []
            [pending] = await agents.list_approvals(engine)
            assert (pending.tool, pending.tool_call_id) == ("refund", "call_r")
            assert pending.arguments == {"order_id": "A1", "cents": 50_000}
            await agents.approve(engine, "wf", by="alice", expect=pending)
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
    finally:
        server.stop()
    assert result["output"] == "Refunded."
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["cents"]) == ("refund", 50_000)
    assert [r["turn"] for r in server.requests] == [0, 1]  # the parked turn was not asked again
    [signal] = [e for e in history if e.kind == "signal"]
    assert signal.name == "approval:call_r"
    assert json.loads(signal.payload or "{}")["by"] == "alice"  # who decided is journaled
    assert "tool:refund:call_r" in [e.name for e in history]


async def test_a_rejected_tool_call_reaches_the_model_as_its_result(
    sqlite_url: str, effects: Path
) -> None:
    server = _serve([REFUND, text("Sorry.")])
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support, "refund A1", workflow_id="wf")
            await until(handle, "waiting")
            await agents.reject(engine, "wf", by="bob", reason="too large")
            result = await handle.result(timeout=20)
    finally:
        server.stop()
    assert result["output"] == "Sorry."
    assert tools.effects(effects) == []
    [message] = [m for m in server.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert message["tool_call_id"] == "call_r" and "rejected by bob" in message["content"]


async def test_a_streamed_run_journals_one_step_per_turn(sqlite_url: str, effects: Path) -> None:
    server = _serve(TWO_LOOKUPS)
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support_streamed, "orders?", workflow_id="wf")
            output = await handle.result(timeout=20)
            names = [e.name for e in await engine.history("wf")]
    finally:
        server.stop()
    assert output.startswith("Both orders shipped. (") and not output.endswith("(0 events)")
    assert [r["stream"] for r in server.requests] == [True, True, True]
    assert names.count("llm:pydantic_ai") == 3 and len(names) == 5


async def test_run_outside_a_workflow_is_refused() -> None:
    with pytest.raises(durably.NotInWorkflow, match=r"DurableAgent\.run\(\) was called outside"):
        await pai_flows.durable.run("hello")


async def test_approved_with_changed_arguments_runs_the_tool_with_them_validated(
    sqlite_url: str, effects: Path
) -> None:
    server = _serve([REFUND, text("Refunded less.")])
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support, "refund A1", workflow_id="wf")
            await until(handle, "waiting")
            changed = {"order_id": "A1", "cents": "20000"}  # validated into the tool's int
            await agents.approve(engine, "wf", by="alice", override_args=changed)
            result = await handle.result(timeout=20)
    finally:
        server.stop()
    assert result["output"] == "Refunded less."
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["cents"]) == ("refund", 20_000)


def test_a_model_client_that_retries_on_its_own_is_warned_about() -> None:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="t")  # max_retries=2
    model = OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))
    with pytest.warns(agents.ClientRetriesWarning, match="max_retries=2"):
        DurableAgent(Agent(model))


def test_the_public_surface_is_deliberate() -> None:
    from durably.integrations import pydantic_ai

    assert pydantic_ai.__all__ == ["DurableAgent", "DurableModel", "DurableToolset"]


async def test_streamed_text_reaches_the_event_handler_while_the_model_step_runs(
    store_url: str, effects: Path
) -> None:
    long = "Both orders shipped on Monday and should arrive before the weekend."
    server = _serve([text(long, chunk_delay=0.05)])
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(pai_flows.support_live_events, "orders?", workflow_id="wf")
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=20)
    finally:
        server.stop()
    assert result["output"] == replayed["output"] == long
    pieces = result["deltas"]
    assert len(pieces) > 3 and "".join(p for p, _ in pieces) == long
    # live: the first piece reached the handler before the turn's step had finished
    # (later ones may be handled after it, when the handler lags behind the stream)
    assert pieces[0][1] == 0
    assert [e.name for e in history] == ["llm:pydantic_ai"]  # one journal entry for the turn
    # a replayed turn comes from the journal after its step, whole, without a request
    assert "".join(p for p, _ in replayed["deltas"]) == long
    assert {done for _, done in replayed["deltas"]} == {1}
    assert len(server.requests) == 1


async def test_token_counts_before_requests_are_steps_a_replay_reads(
    sqlite_url: str, effects: Path
) -> None:
    """``count_tokens_before_request`` asks the provider before every request: a step, so a
    replay neither asks again nor may count otherwise (and trip a limit it did not)."""
    server = _serve(TWO_LOOKUPS)
    try:
        async with durably.Engine(sqlite_url) as engine:
            handle = await engine.start(pai_flows.counted_support, "orders?", workflow_id="wf")
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=20)
    finally:
        server.stop()
    assert result == replayed and result["output"] == "Both orders shipped."
    assert [e.name for e in history if e.name == "count_tokens"] == ["count_tokens"] * 3
    counted = [e for e in tools.effects(effects) if e["kind"] == "count_tokens"]
    assert [e["messages"] for e in counted] == [1, 3, 5]  # once per request, none replayed
