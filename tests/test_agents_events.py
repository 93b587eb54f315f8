"""Streaming to the caller: ``agent.run(..., on_event=...)`` gets text deltas and tool events.

Deltas arrive in order while the model step runs (live only); a turn served
from the journal is delivered once, whole, marked replayed; the journal still
keeps one entry per turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, text, tool_calls

EVENTS: list[agents.AgentEvent] = []
AGENT: list[agents.Agent] = []


@agents.tool
async def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@durably.workflow(name="events-flow")
async def events_flow(question: str) -> str:
    result = await AGENT[0].run(question, on_event=EVENTS.append)
    await durably.wait_for_signal("go")
    return str(result.output)


LONG = "Your order A1 has shipped and should arrive on Tuesday."


async def test_deltas_arrive_live_in_order_and_a_replay_is_marked(store_url: str) -> None:
    script = by_turn([tool_calls(call("lookup", {"order_id": "A1"}, id="c1")), text(LONG)])
    with FakeModelServer(script) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            AGENT[:] = [
                agents.Agent(client=client, model="gpt-4.1-mini", tools=[lookup], stream=True)
            ]
            EVENTS.clear()
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                handle = await engine.start(events_flow, "where?", workflow_id="wf")
                deadline = asyncio.get_running_loop().time() + 10
                while await handle.status() != "waiting":
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
                live = list(EVENTS)
                EVENTS.clear()
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                await engine.send_signal("wf", "go")
                assert await engine.handle("wf").result(timeout=10) == LONG
                replayed = list(EVENTS)
                history = await engine.history("wf")
        assert len(server.requests) == 2

    deltas = [e for e in live if e.kind == "text"]
    assert len(deltas) > 3, deltas  # streamed in pieces, not once at the end
    assert "".join(e.text for e in deltas) == LONG
    assert not any(e.replayed for e in live)
    kinds = [e.kind for e in live if e.kind != "text"]
    assert kinds == ["tool_start", "tool_end"]
    start, end = (e for e in live if e.kind.startswith("tool"))
    assert (start.tool, start.call_id, start.arguments) == ("lookup", "c1", {"order_id": "A1"})
    assert end.result is not None and "shipped" in end.result

    texts = [e for e in replayed if e.kind == "text"]
    assert [e.text for e in texts] == [LONG]  # once, whole
    assert all(e.replayed for e in replayed)
    assert len([e for e in history if e.name == "llm:chat.completions"]) == 2  # one per turn


INNER: list[agents.DurableLLM] = []


@durably.step
async def summarize_inside_a_step(question: str) -> str:
    reply = await INNER[0].chat.completions.create(
        model="gpt-4.1-mini", messages=[{"role": "user", "content": question}]
    )
    return reply.choices[0].message.content or ""


@durably.workflow(name="events-model-in-step")
async def model_in_step() -> str:
    try:
        return await summarize_inside_a_step("hi")
    except durably.NotInWorkflow as exc:
        return f"refused: {exc}"


async def test_a_model_call_inside_a_step_is_refused_not_run_undurably(sqlite_url: str) -> None:
    with FakeModelServer([text("hello")]) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            INNER[:] = [agents.llm(client)]
            async with durably.Engine(sqlite_url) as engine:
                handle = await engine.start(model_in_step, workflow_id="wf")
                said = await handle.result(timeout=10)
        assert server.requests == []  # nothing was asked undurably
    assert said.startswith("refused: ") and "inside a step" in said, said
