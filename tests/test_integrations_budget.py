"""Budgets for the framework integrations: ``DurableAgent(..., max_tokens=)`` and
``DurableRunner.run(..., max_cost=/max_tokens=)``, counted from the journal as for Agent.

Each model call costs 110 tokens (scripted usage). With a budget of 200 the
third call is not asked: the run parks, a restarted engine replays the count
and stays parked without a request (the server's log is the truth), and a
person raises the budget (or stops the run).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably import agents, cli
from durably.integrations.openai_agents import DurableRunner
from durably.integrations.pydantic_ai import DurableAgent
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness
from tests.integkit import oai_flows, pai_flows

USAGE = {"prompt_tokens": 100, "completion_tokens": 10}  # 110 tokens a call
SCRIPT = [
    tool_calls(call("lookup_order", {"order_id": "A1"}, id="call_1"), usage=USAGE),
    tool_calls(call("lookup_order", {"order_id": "A2"}, id="call_2"), usage=USAGE),
    text("Both orders shipped.", usage=USAGE),
]


@pytest.fixture(autouse=True)
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


budgeted_pai = DurableAgent(pai_flows.agent, max_tokens=200)


@durably.workflow(name="budget-pai")
async def pai_run(question: str) -> str:
    return str((await budgeted_pai.run(question)).output)


@durably.workflow(name="budget-pai-per-run")
async def pai_per_run(question: str) -> str:
    return str((await pai_flows.durable.run(question, max_tokens=200)).output)


@durably.workflow(name="budget-oai")
async def oai_run(question: str) -> str:
    config = oai_flows.RunConfig(model_provider=oai_flows.provider())
    result = await DurableRunner.run(
        oai_flows.support_agent, question, run_config=config, max_tokens=200
    )
    return str(result.final_output)


FLOWS = {"pai": pai_run, "pai-per-run": pai_per_run, "oai": oai_run}


def _serve() -> FakeModelServer:
    server = FakeModelServer(by_turn(SCRIPT)).start()
    pai_flows.client.base_url = server.url
    oai_flows.client.base_url = server.url
    return server


async def _until(handle: durably.WorkflowHandle[Any], status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (now := await handle.status()) != status:
        assert now in ("pending", "running", "waiting"), now
        assert asyncio.get_running_loop().time() < deadline, f"still {now}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("flow", list(FLOWS))
async def test_the_run_parks_at_its_budget_across_a_restart_and_a_raise_finishes_it(
    store_url: str, flow: str
) -> None:
    server = _serve()
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(FLOWS[flow], "orders?", workflow_id="wf")
            await _until(handle, "waiting")
            assert len(server.requests) == 2  # 220 tokens: the third call is not asked
            event = await engine.get_event("wf", agents.budget.SIGNAL)
            assert event["spent"]["tokens"] == 220 and event["max_tokens"] == 200, event
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = engine.handle("wf")
            await _until(handle, "waiting")  # the replayed count parks it again
            assert len(server.requests) == 2
            await agents.set_budget(engine, "wf", by="alice", max_tokens=1000)
            assert await handle.result(timeout=20) == "Both orders shipped."
        assert len(server.requests) == 3
    finally:
        server.stop()


@pytest.mark.parametrize("flow", ["pai", "oai"])
async def test_a_person_can_stop_an_integration_run_at_its_budget(
    sqlite_url: str, flow: str
) -> None:
    server = _serve()
    try:
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(FLOWS[flow], "orders?", workflow_id="wf")
            await _until(handle, "waiting")
            await agents.set_budget(engine, "wf", by="bob", stop=True)
            with pytest.raises(agents.BudgetExceeded, match="stopped by bob"):
                await handle.result(timeout=20)
        assert len(server.requests) == 2
    finally:
        server.stop()


def test_a_negative_budget_is_refused_when_wrapping() -> None:
    with pytest.raises(durably.DefinitionError, match="max_cost"):
        DurableAgent(pai_flows.agent, max_cost=-1)


def _runner(db: Path, env: dict[str, str], *extra: str) -> Any:
    argv = ["-m", "tests.integkit.runner", "--flows", "tests.integkit.pai_flows"]
    argv += ["--workflow", "support_budget", "--db", str(db), "--id", "b-1", "--input", "orders?"]
    done = harness.run([*argv, *extra], env)
    if done.returncode < 0:
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_crash_loop_cannot_spend_past_a_pydantic_ai_budget(tmp_path: Path) -> None:
    """Every process dies right after the model answered, before the receipt.

    Budget 250 tokens. Process 1: turn 0 (110, journaled), turn 1 answered and
    lost. Process 2: turn 1 asked again (110 + 110 lost = 220 < 250), answered
    and lost. Process 3: 110 + 2 lost x 110 = 330 >= 250: it does not ask, it
    parks. Raised from the command line, the run finishes.
    """
    db, effects, log = tmp_path / "pai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    budget = {harness.MAX_TOKENS_ENV: "250"}
    with FakeModelServer(by_turn(SCRIPT), log_path=log) as server:
        first = {**budget, "DURABLY_CRASH_AT": "after_call:llm:pydantic_ai@2"}
        assert _runner(db, harness.child_env(server.url, effects, first)) is None
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        loop = harness.child_env(
            server.url, effects, {**budget, "DURABLY_CRASH_AT": "after_call:llm:pydantic_ai"}
        )
        assert _runner(db, loop) is None
        assert [r["turn"] for r in read_log(log)] == [0, 1, 1]
        for _ in range(2):  # the budget, not the crash plan, stops the loop
            assert _runner(db, loop, "--until", "waiting") == {"status": "waiting"}
            assert [r["turn"] for r in read_log(log)] == [0, 1, 1]
        url = f"sqlite:///{db}"
        with durably.Client(url) as client:
            why = client.get_event("b-1", agents.budget.SIGNAL)
        assert why["max_tokens"] == 250 and why["spent"]["tokens"] == 330, why
        raised = CliRunner().invoke(
            cli.main, ["-d", url, "budget", "b-1", "--by", "alice", "--max-tokens", "2000"]
        )
        assert raised.exit_code == 0, raised.output
        done = _runner(db, harness.child_env(server.url, effects, budget))

    assert done["status"] == "completed", done
    assert done["result"]["output"] == "Both orders shipped."
    assert [r["turn"] for r in read_log(log)] == [0, 1, 1, 1, 2]


async def test_a_turn_answered_after_a_lost_request_is_counted_the_same_on_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests a crash lost before a turn's answer count on every replay, not only live.

    Budget 300 tokens. A process dies right after turn 0 was answered. The
    next run asks turn 0 again (110 + 110 lost) and turn 1 (330 >= 300): it
    parks before turn 2. Raised to 400, the replay must count 330 again, so it
    parks where the live run did, takes the raise and asks turn 2 (it counted
    220 before, skipped the park and diverged from its journal).
    """
    db, effects, log = tmp_path / "pai.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    budget = {harness.MAX_TOKENS_ENV: "300"}
    monkeypatch.setenv(harness.MAX_TOKENS_ENV, "300")
    url = f"sqlite:///{db}"
    with FakeModelServer(by_turn(SCRIPT), log_path=log) as server:
        crash = {**budget, "DURABLY_CRASH_AT": "after_call:llm:pydantic_ai"}
        assert _runner(db, harness.child_env(server.url, effects, crash)) is None
        pai_flows.client.base_url = server.url
        async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.05) as engine:
            await _until(engine.handle("b-1"), "waiting")
            assert [r["turn"] for r in read_log(log)] == [0, 0, 1]
            why = await engine.get_event("b-1", agents.budget.SIGNAL)
            assert why["spent"]["tokens"] == 330, why
        async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.05) as engine:
            await agents.set_budget(engine, "b-1", by="alice", max_tokens=400)
            done = await engine.handle("b-1").result(timeout=10)

    assert done == {"output": "Both orders shipped."}
    assert [r["turn"] for r in read_log(log)] == [0, 0, 1, 2]
