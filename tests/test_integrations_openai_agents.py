"""OpenAI Agents SDK runs made durable by wrapping: DurableRunner, with the real agents package.

The SDK's default Responses API model and its chat completions model both talk
to the fake model server with the real openai client; tool effects are counted
from a file, model requests from the server's log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall

import durably
from durably import agents, codec
from durably.integrations.openai_agents import DurableRunner
from durably.testing.models import (
    FakeModelServer,
    by_turn,
    call,
    read_log,
    text,
    tool_calls,
    turn_of,
)
from tests.agentkit import harness, tools
from tests.agentkit.live import until
from tests.integkit import oai_flows

TWO_LOOKUPS = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("lookup_order", {"order_id": "A2"}, id="call_2")),
    text("Both orders shipped."),
]
HANDOFF = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1")),
    tool_calls(call("transfer_to_billing", {}, id="call_h")),
    text("Billing here: nothing to refund."),
]
REFUND = tool_calls(call("refund", {"order_id": "A1", "cents": 50_000}, id="call_r"))


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


def _serve(script: list[Any]) -> FakeModelServer:
    server = FakeModelServer(by_turn(script)).start()
    oai_flows.client.base_url = server.url
    return server


def _runner(db: Path, wid: str, env: dict[str, str]) -> Any:
    argv = ["-m", "tests.integkit.runner", "--flows", "tests.integkit.oai_flows"]
    argv += ["--workflow", "support", "--db", str(db), "--id", wid, "--input", "orders?"]
    done = harness.run(argv, env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kill_after_the_second_tool_call_asks_no_completed_turn_again(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "oai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(TWO_LOOKUPS), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:call_2"}
        killed = _runner(db, "oai-1", harness.child_env(server.url, effects, crash))
        assert killed is None, "the first process should have been SIGKILLed"
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        done = _runner(db, "oai-1", harness.child_env(server.url, effects))

    assert done["status"] == "completed", done
    result = done["result"]
    assert result["output"] == "Both orders shipped."
    requests = read_log(log)
    assert {r["path"] for r in requests} == {"/v1/responses"}  # the SDK's default model
    assert [r["turn"] for r in requests] == [0, 1, 2]  # each turn asked exactly once
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2"]  # each effect once
    served = [r["usage"] for r in requests]
    assert result["replayed"]["calls"] == 2
    assert result["replayed"]["prompt_tokens"] == sum(u["input_tokens"] for u in served[:2])
    assert result["billed"]["calls"] == 1
    assert result["billed"]["prompt_tokens"] == served[2]["input_tokens"]
    # the last request was rebuilt from the journal: both tool outputs, by call id
    outputs = [i for i in requests[-1]["body"]["input"] if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in outputs] == ["call_1", "call_2"]


async def test_one_step_per_turn_and_tool_call_handoffs_included_and_a_replay_asks_nothing(
    store_url: str, effects: Path
) -> None:
    server = _serve(HANDOFF)
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_flows.triage, "refund A1?", workflow_id="wf")
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
            assert len(server.requests) == 3
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=20)
    finally:
        server.stop()
    assert [(e.kind, e.name) for e in history] == [
        ("step", "llm:openai_agents"),
        ("step", "tool:lookup_order:call_1"),
        ("step", "llm:openai_agents"),
        ("step", "llm:openai_agents"),
    ]
    assert {r["path"] for r in server.requests} == {"/v1/chat/completions"}
    assert result["output"] == replayed["output"] == "Billing here: nothing to refund."
    assert result["last_agent"] == replayed["last_agent"] == "billing"  # the handoff replayed
    assert len(server.requests) == 3  # the replay made no model request
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1"]
    assert (replayed["billed"]["calls"], replayed["replayed"]["calls"]) == (0, 3)
    first: Any = codec.decode(history[0].payload or "null", where="test")
    assert first["response"]["output"][0]["type"] == "function_call"
    assert agents.usage_from_history(history).calls == 3


async def test_a_tool_needing_approval_parks_the_workflow_and_runs_once_approved(
    store_url: str, effects: Path
) -> None:
    server = _serve([REFUND, text("Refunded.")])
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_flows.support, "refund A1", workflow_id="wf")
            await until(handle, "waiting")
            assert tools.effects(effects) == []
            [pending] = await agents.list_approvals(engine)
            assert (pending.tool, pending.tool_call_id) == ("refund", "call_r")
            assert pending.arguments == {"order_id": "A1", "cents": 50_000}
            await agents.approve(engine, "wf", by="alice", expect=pending)
            result = await handle.result(timeout=20)
    finally:
        server.stop()
    assert result["output"] == "Refunded."
    [ran] = tools.effects(effects)
    assert (ran["kind"], ran["cents"]) == ("refund", 50_000)
    assert [r["turn"] for r in server.requests] == [0, 1]


async def test_a_rejected_tool_call_reaches_the_model_as_its_output(
    sqlite_url: str, effects: Path
) -> None:
    server = _serve([REFUND, text("Sorry.")])
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_flows.support, "refund A1", workflow_id="wf")
            await until(handle, "waiting")
            await agents.reject(engine, "wf", by="bob", reason="too large")
            result = await handle.result(timeout=20)
    finally:
        server.stop()
    assert result["output"] == "Sorry."
    assert tools.effects(effects) == []
    items = server.requests[-1]["body"]["input"]
    [output] = [i for i in items if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_r" and "rejected by bob" in output["output"]


async def test_run_outside_a_workflow_is_refused() -> None:
    with pytest.raises(durably.NotInWorkflow, match=r"DurableRunner\.run\(\) was called outside"):
        await DurableRunner.run(oai_flows.support_agent, "hello")


async def test_the_fake_server_speaks_the_responses_api() -> None:
    with FakeModelServer(by_turn(TWO_LOOKUPS)) as server:
        client = AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0)
        first = await client.responses.create(model="gpt-4.1-mini", input="orders?")
        [fc] = first.output
        assert isinstance(fc, ResponseFunctionToolCall)
        assert (fc.call_id, fc.name) == ("call_1", "lookup_order")
        follow: Any = [
            {"role": "user", "content": "orders?"},
            fc.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
        ]
        second = await client.responses.create(model="gpt-4.1-mini", input=follow)
        await client.close()
    assert second.output[0].type == "function_call"  # turn 1: one run of model output so far
    assert first.usage is not None and first.usage.input_tokens > 0
    # one turn's parallel calls are one turn
    parallel = [
        {"type": "function_call", "call_id": "a"},
        {"type": "function_call", "call_id": "b"},
    ]
    assert turn_of({"input": [{"role": "user", "content": "x"}, *parallel]}) == 1
    assert [r["turn"] for r in server.requests] == [0, 1]


async def test_a_run_config_given_as_a_dict_is_honoured(sqlite_url: str, effects: Path) -> None:
    server = _serve(TWO_LOOKUPS)
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_flows.support_dict_config, "orders?", workflow_id="wf")
            result = await handle.result(timeout=20)
            names = [e.name for e in await engine.history("wf")]
    finally:
        server.stop()
    assert result["output"] == "Both orders shipped."
    assert {r["path"] for r in server.requests} == {"/v1/responses"}
    assert names.count("llm:openai_agents") == 3


def test_the_public_surface_is_deliberate() -> None:
    from durably.integrations import openai_agents

    assert openai_agents.__all__ == ["DurableModel", "DurableModelProvider", "DurableRunner"]


async def test_an_on_handoff_callback_runs_once_and_a_replay_hands_off_again(
    store_url: str, effects: Path
) -> None:
    server = _serve(HANDOFF)
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(oai_flows.triage_on_handoff, "refund A1?", workflow_id="wf")
            result = await handle.result(timeout=20)
            history = await engine.history("wf")
            fork = await engine.fork("wf", from_seq=len(history), workflow_id_new="wf-replay")
            replayed = await fork.result(timeout=20)
    finally:
        server.stop()
    assert ("step", "handoff:transfer_to_billing") in [(e.kind, e.name) for e in history]
    assert result["last_agent"] == replayed["last_agent"] == "billing"
    assert result["output"] == replayed["output"] == "Billing here: nothing to refund."
    assert len(server.requests) == 3  # the replay made no model request
    ran = tools.effects(effects)
    assert [e["kind"] for e in ran] == ["lookup", "handoff"]  # the callback ran once
