"""A tool result that goes to the model is journaled as the JSON the model saw.

The model only ever reads the text of a tool's result, so that is what its step
records: no class path, nothing that a later deploy (a renamed or changed class)
can make undecodable. A direct call of the same tool in workflow code still
returns the tool's own value (its step is another one, ``tool:<name>``).
"""

from __future__ import annotations

import datetime
import json
import sys

import pydantic
import pytest

import durably
from durably import agents
from durably.testing.models import call, text, tool_calls
from tests.agentkit.live import CURRENT, live, until


class Receipt(pydantic.BaseModel):
    refund_id: str
    amount: float
    at: datetime.datetime


@agents.tool
def refund(order_id: str) -> Receipt:
    """Refund an order."""
    return Receipt(refund_id=f"re_{order_id}", amount=12.5, at=datetime.datetime(2026, 1, 2, 3, 4))


@agents.tool(requires_approval=True)
def close_ticket(order_id: str) -> str:
    """Close the ticket (a person approves)."""
    return f"closed {order_id}"


SCRIPT = [
    tool_calls(call("refund", {"order_id": "A1"}, id="c1")),
    tool_calls(call("close_ticket", {"order_id": "A1"}, id="c2")),
    text("Done."),
]


async def test_the_journal_holds_the_text_the_model_saw_and_replays_without_the_class(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with live(sqlite_url, SCRIPT, [refund, close_ticket]) as s:
        handle = await s.start()
        await until(handle, "waiting")  # parked for the approval of c2
        [entry] = [e for e in await s.engine.history("wf") if e.name == "tool:refund:c1"]
        [seen] = [m["content"] for m in s.tool_messages(1)]
        assert "__durably__" not in (entry.payload or "")
        assert json.loads(entry.payload or "null") == json.loads(seen)
        assert json.loads(seen) == {
            "refund_id": "re_A1",
            "amount": 12.5,
            "at": "2026-01-02T03:04:00",
        }
        # a deploy renames the class while the workflow waits: the replay needs no class
        monkeypatch.delattr(sys.modules[__name__], "Receipt")
        await s.engine.approve("wf", by="ann")
        result = await handle.result(timeout=20)
        assert result["output"] == "Done."
        [again] = [m["content"] for m in s.tool_messages(2) if "re_A1" in m["content"]]
        assert again == seen  # the model reads the same text on the replayed turn


@durably.workflow(name="tool-text-direct")
async def direct() -> str:
    receipt = await refund("A2")
    return type(receipt).__name__


async def test_a_direct_call_still_returns_the_tools_value(sqlite_url: str) -> None:
    async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
        handle = await engine.start(direct, workflow_id="d")
        assert await handle.result(timeout=20) == "Receipt"


# --- the agent's final answer: decoded into the output_type of today's agent ----------------


class Verdict(pydantic.BaseModel):
    order_id: str
    refund_cents: int


@durably.workflow(name="tool-text-verdict")
async def verdict_then_wait() -> str:
    result = await CURRENT[0].run("decide")
    go = await durably.wait_for_signal("go")
    return f"{type(result.output).__name__} {result.output.order_id} {go}"


async def test_a_parked_agents_answer_decodes_into_todays_output_type(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = text(json.dumps({"order_id": "A1", "refund_cents": 1200}))
    async with live(sqlite_url, [answer], [], output_type=Verdict) as s:
        handle = await s.engine.start(verdict_then_wait, workflow_id="v")
        await until(handle, "waiting")
        # a deploy renames the class while the workflow waits; today's agent names the new one
        monkeypatch.delattr(sys.modules[__name__], "Verdict")

        class Ruling(pydantic.BaseModel):
            order_id: str
            refund_cents: int

        CURRENT[:] = [agents.Agent(client=s.agent.client, model="m", output_type=Ruling)]
        await s.engine.send_signal("v", "go", "yes")
        assert await handle.result(timeout=20) == "Ruling A1 yes"
        assert len(s.server.requests) == 1  # the answer came from the journal
