"""``Agent(output_type=...)``: the final answer validated, asked again within a bound, journaled.

Against the fake model server with the real openai client, on both backends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness
from tests.agentkit.live import live


class Verdict(pydantic.BaseModel):
    """What the support agent decided."""

    order_id: str
    refund_cents: int
    reason: str


@agents.tool
async def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "paid_cents": 1200}


GOOD = {"order_id": "A1", "refund_cents": 1200, "reason": "damaged"}


async def test_a_valid_answer_is_validated_and_journaled(store_url: str) -> None:
    replies = [
        tool_calls(call("lookup", {"order_id": "A1"}, id="c1")),
        text(json.dumps(GOOD)),
    ]
    async with live(store_url, replies, [lookup], output_type=Verdict) as s:
        result = await s.run()
        history = await s.engine.history("wf")
        first = s.server.requests[0]["body"]
    assert result["output"] == Verdict(**GOOD)
    fmt = first["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"]["required"] == ["order_id", "refund_cents", "reason"]
    assert fmt["json_schema"]["strict"] is True  # every field required: strict is possible
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    [journaled] = [e for e in history if e.name.startswith("output:")]
    assert journaled.status == "completed" and json.loads(journaled.payload or "")["fields"] == GOOD


async def test_an_invalid_answer_is_asked_again_with_the_errors(store_url: str) -> None:
    replies = [
        text("Refund 12 dollars for A1."),  # not JSON
        text(json.dumps({"order_id": "A1", "refund_cents": "lots", "reason": "x"})),
        text(json.dumps(GOOD)),
    ]
    async with live(store_url, replies, [], output_type=Verdict, output_retries=2) as s:
        result = await s.run()
        requests = [r["body"] for r in s.server.requests]
    assert result["output"] == Verdict(**GOOD)
    assert len(requests) == 3 and result["turns"] == 3
    second = requests[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": "Refund 12 dollars for A1."}
    assert second[-1]["role"] == "user" and "not valid JSON" in second[-1]["content"]
    third = requests[2]["messages"][-1]["content"]
    assert "refund_cents" in third and "integer" in third


async def test_the_retries_are_bounded(store_url: str) -> None:
    replies = [text("no"), text("still no"), text("never")]
    async with live(store_url, replies, [], output_type=Verdict, output_retries=1) as s:
        handle = await s.start()
        with pytest.raises(agents.OutputValidationError, match="2 answers") as info:
            await handle.result(timeout=20)
        assert len(s.server.requests) == 2
    assert "Verdict" in str(info.value)


def test_strict_tool_schemas_when_asked() -> None:
    agent = agents.Agent(client=_Client(), model="m", tools=[lookup], strict=True)
    [definition] = agent._definitions
    assert definition["function"]["strict"] is True
    assert definition["function"]["parameters"]["additionalProperties"] is False
    loose = agents.Agent(client=_Client(), model="m", tools=[lookup])
    assert "strict" not in loose._definitions[0]["function"]


class _Client:
    """Enough of an AsyncOpenAI for building an Agent (never called)."""

    max_retries = 0

    class chat:
        class completions:
            @staticmethod
            async def create(**_: Any) -> Any:
                raise AssertionError("not called")


WRONG = [
    text("Refund 12 dollars for A1."),  # not JSON
    text(json.dumps({"order_id": "A1", "refund_cents": "lots"})),  # the first retry: wrong too
    text(json.dumps({"order_id": "A1", "refund_cents": 1200})),
]


@pytest.mark.parametrize(
    ("crash", "asked"),
    [
        # the retry's answer journaled, then killed: only the next retry is asked
        ("after_receipt:llm:chat.completions@2", [0, 1, 2]),
        # the retry answered, killed before its receipt: that retry alone is asked again
        ("after_call:llm:chat.completions@2", [0, 1, 1, 2]),
    ],
)
def test_killed_after_a_validation_retry_no_completed_turn_is_asked_again(
    tmp_path: Path, crash: str, asked: list[int]
) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(WRONG), log_path=log) as server:
        env = harness.child_env(server.url, effects, {"DURABLY_CRASH_AT": crash})
        assert harness.runner(db, "v-1", "refund?", env, "--flow", "verdict") is None
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        done = harness.runner(
            db, "v-1", "refund?", harness.child_env(server.url, effects), "--flow", "verdict"
        )

    assert done["status"] == "completed", done
    assert done["result"]["output"] == {"order_id": "A1", "refund_cents": 1200}
    requests = read_log(log)
    assert [r["turn"] for r in requests] == asked
    # the last request carries both corrections, rebuilt from the journal
    last = requests[-1]["body"]["messages"]
    assert [m["role"] for m in last[-4:]] == ["assistant", "user", "assistant", "user"]
    result = done["result"]
    assert result["billed"]["calls"] + result["replayed"]["calls"] == 3
