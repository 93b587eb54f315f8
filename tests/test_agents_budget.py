"""Budgets that survive crashes: counted from the journal, enforced across SIGKILLs.

Real child processes on a real SQLite file, the real openai client against the
fake model server whose log is the truth about what was asked (and so paid).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

import durably
from durably import agents, cli
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools

USAGE = {"prompt_tokens": 100, "completion_tokens": 10}  # 110 tokens a call


def _lookups(n: int) -> list[Any]:
    turns = [
        tool_calls(call("lookup_order", {"order_id": f"A{i}"}, id=f"call_{i}"), usage=USAGE)
        for i in range(1, n + 1)
    ]
    return [*turns, text(f"All {n} orders shipped.", usage=USAGE)]


def test_a_crash_loop_cannot_spend_past_the_budget(tmp_path: Path) -> None:
    """Every process dies right after the model answered, before the receipt.

    Budget 250 tokens. Process 1: turn 0 (110, journaled), turn 1 answered and
    lost. Process 2: turn 1 asked again (110 journaled + 110 lost = 220 < 250),
    answered and lost. Process 3: 110 + 2 lost x 110 = 330 >= 250: it does not
    ask, it parks. Process 4 (same crash plan) stays parked without a request.
    Raised from the command line, the run finishes; each tool effect ran once.
    """
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    budget = {harness.MAX_TOKENS_ENV: "250"}
    with FakeModelServer(by_turn(_lookups(3)), log_path=log) as server:
        first = {**budget, "DURABLY_CRASH_AT": "after_call:llm:chat.completions@2"}
        env = harness.child_env(server.url, effects, first)
        assert harness.runner(db, "b-1", "orders?", env) is None
        assert [r["turn"] for r in read_log(log)] == [0, 1]

        loop = {**budget, "DURABLY_CRASH_AT": "after_call:llm:chat.completions"}
        env = harness.child_env(server.url, effects, loop)
        assert harness.runner(db, "b-1", "orders?", env) is None
        assert [r["turn"] for r in read_log(log)] == [0, 1, 1]
        for _ in range(2):  # the budget, not the crash plan, stops the loop
            parked = harness.runner(db, "b-1", "orders?", env, "--until", "waiting")
            assert parked == {"status": "waiting"}
            assert [r["turn"] for r in read_log(log)] == [0, 1, 1]

        with durably.Client(f"sqlite:///{db}") as client:
            why = client.get_event("b-1", agents.budget.SIGNAL)
        assert why["max_tokens"] == 250 and why["spent"]["tokens"] == 330, why
        url = f"sqlite:///{db}"
        raised = CliRunner().invoke(
            cli.main, ["-d", url, "budget", "b-1", "--by", "alice", "--max-tokens", "2000"]
        )
        assert raised.exit_code == 0, raised.output
        assert "raised" in raised.output
        done = harness.runner(db, "b-1", "orders?", harness.child_env(server.url, effects, budget))

    assert done["status"] == "completed", done
    assert done["result"]["output"] == "All 3 orders shipped."
    assert [r["turn"] for r in read_log(log)] == [0, 1, 1, 1, 2, 3]
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2", "A3"]
    shown = CliRunner().invoke(cli.main, ["-d", url, "show", "b-1"])
    assert f"{len(read_log(log))} requests sent" in " ".join(shown.output.split()), shown.output


LLM: list[agents.DurableLLM] = []


@durably.workflow(name="budget-llm")
async def ask_three() -> list[str]:
    said = []
    for word in ("a", "b", "c"):
        reply = await LLM[0].chat.completions.create(
            model="gpt-4.1-mini", messages=[{"role": "user", "content": word}]
        )
        said.append(reply.choices[0].message.content or "")
    return said


def _echo(body: dict[str, Any]) -> Any:
    return text(f"echo {body['messages'][-1]['content']}", usage=USAGE)


async def _until(handle: durably.WorkflowHandle, status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while (now := await handle.status()) != status:
        assert asyncio.get_running_loop().time() < deadline, f"still {now}"
        await asyncio.sleep(0.02)


async def test_llm_parks_at_its_budget_and_a_raise_lets_it_finish(store_url: str) -> None:
    with FakeModelServer(_echo) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as c:
            LLM[:] = [agents.llm(c, max_tokens=200)]
            async with durably.Engine(store_url, hold_seconds=0.05) as engine:
                handle = await engine.start(ask_three, workflow_id="wf")
                await _until(handle, "waiting")
                assert len(server.requests) == 2  # 220 tokens: the third is not asked
                event = await engine.get_event("wf", agents.budget.SIGNAL)
                assert event["spent"]["tokens"] == 220
                await agents.set_budget(engine, "wf", by="alice", max_tokens=1000)
                assert await handle.result(timeout=10) == ["echo a", "echo b", "echo c"]
            assert len(server.requests) == 3


async def test_a_person_can_stop_a_run_at_its_budget(store_url: str) -> None:
    with FakeModelServer(_echo) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as c:
            LLM[:] = [agents.llm(c, max_tokens=100)]
            async with durably.Engine(store_url, hold_seconds=0.05) as engine:
                handle = await engine.start(ask_three, workflow_id="wf")
                await _until(handle, "waiting")
                await agents.set_budget(engine, "wf", by="bob", stop=True)
                with pytest.raises(agents.BudgetExceeded, match="stopped by bob"):
                    await handle.result(timeout=10)
            assert len(server.requests) == 1
