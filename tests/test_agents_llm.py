"""``durably.llm``: the client's API with every create() a step; the engine owns retries."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest

import durably
from durably import agents
from durably.agents import completions
from durably.testing.models import FakeModelServer, failure, text

LLM: list[agents.DurableLLM] = []


def _echo(body: dict[str, Any]) -> Any:
    said = body["messages"][-1]["content"]
    return text(f"echo {said}", delay=0.2 if said == "a" else 0.0)


@durably.workflow(name="agents-llm-flow")
async def llm_flow(wait: bool) -> dict[str, Any]:
    create = LLM[0].chat.completions.create
    messages = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    a, b = await asyncio.gather(
        create(model="gpt-4.1-mini", messages=messages[0]),
        create(model="gpt-4.1-mini", messages=messages[1]),
    )
    if wait:
        await durably.wait_for_signal("go")
    usage = agents.run_usage()
    return {
        "a": a.choices[0].message.content,
        "b": b.choices[0].message.content,
        "type": type(a).__name__,
        "billed": usage.billed.calls,
        "replayed": usage.replayed.calls,
    }


@pytest.fixture
async def server() -> AsyncIterator[FakeModelServer]:
    with FakeModelServer(_echo) as srv:
        yield srv


async def _engine_run(url: str, wait: bool = False) -> tuple[dict[str, Any], durably.Engine]:
    async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
        handle = await engine.start(llm_flow, wait, workflow_id="wf")
        if wait:
            while await handle.status() != "waiting":
                await asyncio.sleep(0.02)
            await engine.send_signal("wf", "go")
        return await handle.result(timeout=10), engine


async def test_gathered_calls_are_steps_in_call_order_and_replay_without_requests(
    sqlite_url: str, server: FakeModelServer
) -> None:
    async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
        LLM[:] = [agents.llm(client)]
        result, _ = await _engine_run(sqlite_url, wait=True)
    assert result == {
        "a": "echo a",
        "b": "echo b",
        "type": "ChatCompletion",
        "billed": 0,  # the run that returned had parked; it replayed both calls
        "replayed": 2,
    }
    keys = {r["body"]["messages"][0]["content"]: r["idempotency_key"] for r in server.requests}
    assert keys == {"a": "wf:1", "b": "wf:2"}  # seqs in call order, though "b" finished first


async def test_a_sync_client_works_the_same(sqlite_url: str, server: FakeModelServer) -> None:
    with openai.OpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
        LLM[:] = [agents.llm(client)]
        result, _ = await _engine_run(sqlite_url)
    assert (result["a"], result["b"], result["billed"]) == ("echo a", "echo b", 2)


async def test_outside_a_workflow_it_is_a_plain_call(server: FakeModelServer) -> None:
    async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
        llm = agents.llm(client)
        reply = await llm.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        stream = await llm.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "y"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert reply.choices[0].message.content == "echo x"
    assert "".join(p or "" for p in pieces) == "echo y" and not stream.replayed


async def test_a_client_that_retries_on_its_own_is_warned_about(server: FakeModelServer) -> None:
    async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=2) as client:
        with pytest.warns(agents.ClientRetriesWarning, match="max_retries=0"):
            agents.llm(client)
        with pytest.warns(agents.ClientRetriesWarning):
            agents.Agent(client=client, model="m")


# --- retries ------------------------------------------------------------------------------

FAST = agents.ModelRetry(initial=0.05, max_delay=0.1)


@pytest.mark.parametrize(
    ("failing", "gap"),
    [(failure(429, retry_after=0.4), 0.4), (failure(503), 0.0), (failure(500), 0.0)],
    ids=["429-retry-after", "503", "500"],
)
async def test_transient_failures_are_retried_with_the_same_key(
    sqlite_url: str, failing: Any, gap: float
) -> None:
    asked: list[str] = []

    def flaky(body: dict[str, Any]) -> Any:  # "a" fails twice, then answers
        said = body["messages"][-1]["content"]
        asked.append(said)
        return failing if said == "a" and asked.count("a") <= 2 else text(f"echo {said}")

    with FakeModelServer(flaky) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            LLM[:] = [agents.llm(client, retry=FAST)]
            result, _ = await _engine_run(sqlite_url)
    assert (result["a"], result["b"]) == ("echo a", "echo b")
    tries = [r for r in server.requests if r["idempotency_key"] == "wf:1"]
    statuses = [r["status"] for r in tries]
    assert statuses == [failing.status, failing.status, 200]
    assert tries[1]["ts"] - tries[0]["ts"] >= gap * 0.9
    assert tries[2]["ts"] - tries[1]["ts"] >= gap * 0.9


async def test_a_bad_request_is_not_retried(sqlite_url: str) -> None:
    def bad_a(body: dict[str, Any]) -> Any:
        said = body["messages"][-1]["content"]
        return failure(400, message="bad tools") if said == "a" else text(f"echo {said}")

    with FakeModelServer(bad_a) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            LLM[:] = [agents.llm(client, retry=FAST)]
            with pytest.raises((openai.BadRequestError, durably.StepError), match="bad tools"):
                await _engine_run(sqlite_url)
    assert [r["status"] for r in server.requests if r["idempotency_key"] == "wf:1"] == [400]


def _error(status: int | None = None, headers: dict[str, str] | None = None) -> Any:
    exc = Exception("x")
    exc.status_code = status  # type: ignore[attr-defined]
    exc.response = SimpleNamespace(headers=headers or {})  # type: ignore[attr-defined]
    return exc


def test_retry_after_is_read_from_seconds_milliseconds_or_a_date() -> None:
    assert completions.retry_after(_error(429, {"Retry-After": "2"})) == 2.0
    assert completions.retry_after(_error(429, {"retry-after-ms": "250"})) == 0.25
    now = 1_700_000_000.0
    date = email.utils.format_datetime(
        datetime.datetime.fromtimestamp(now + 30, datetime.UTC), usegmt=True
    )
    assert completions.retry_after(_error(429, {"Retry-After": date}), now=lambda: now) == 30.0
    assert completions.retry_after(_error(429, {"Retry-After": "soon"})) is None
    assert completions.retry_after(_error(429)) is None


def test_model_retry_retries_only_transient_failures_and_caps_retry_after() -> None:
    policy = agents.ModelRetry(max_attempts=3, initial=1.0, jitter=0.0, max_retry_after=10.0)
    assert policy.delay_after(1, _error(429, {"Retry-After": "999"})) == 10.0
    assert policy.delay_after(1, _error(429, {"Retry-After": "3"})) == 3.0
    assert policy.delay_after(2, _error(500)) == 2.0  # exponential back-off without a hint
    assert policy.delay_after(3, _error(500)) is None  # attempts used up
    for final in (400, 401, 403, 404, 422):
        assert policy.delay_after(1, _error(final)) is None
    assert policy.delay_after(1, durably.StepTimeout("slow")) == 1.0
    assert policy.delay_after(1, ConnectionResetError()) == 1.0
    assert policy.delay_after(1, ValueError("a bug")) is None


def test_a_streamed_completion_is_assembled_into_one() -> None:
    chunks = [
        {
            "id": "c",
            "model": "m",
            "created": 1,
            "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        },
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "t1", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    out = completions.assemble(chunks)
    assert out["id"] == "c" and out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Hello"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
