"""A streamed model turn whose stream ends early is retried, never journaled half.

The fake server below cuts its first streamed answer after a few chunks (the
connection closes cleanly, with no final chunk and no ``[DONE]``): the openai
client ends its iteration without an error, so only the model step can tell
the answer is incomplete. The journal must keep the whole answer of the
retried request, not the cut one's first words.
"""

from __future__ import annotations

import json
import threading
from typing import Any, ClassVar

import openai
import pytest

import durably
from durably import agents
from durably.testing import models
from durably.testing.models import FakeModelServer, by_turn, text

LONG = "Your order A1 has shipped and should arrive on Tuesday, before noon."
FAST = agents.ModelRetry(initial=0.05, max_delay=0.1)
LLM: list[agents.DurableLLM] = []


class _CutHandler(models._Handler):
    """Answers the first streamed request with its first chunks only, then closes."""

    cuts: ClassVar[list[int]] = []  # how many more streams to cut
    lock = threading.Lock()

    def _stream(self, completion: dict[str, Any], body: dict[str, Any], pause: float = 0.0) -> None:
        with self.lock:
            cut = bool(self.cuts) and self.cuts.pop() > 0
        if not cut:
            super()._stream(completion, body, pause)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = list(models.models_chat.stream_chunks(completion, True))
        for chunk in chunks[:3]:  # the role and two pieces of text: no finish, no [DONE]
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def _stream_events(self, events: Any, pause: float = 0.0) -> None:
        with self.lock:
            cut = bool(self.cuts) and self.cuts.pop() > 0
        if not cut:
            super()._stream_events(events, pause)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event, data in list(events)[:4]:  # message_start, a block, a piece: no stop
            self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class _OverloadedHandler(_CutHandler):
    """Answers the first Anthropic stream with ``message_start`` then an ``overloaded_error``.

    Anthropic sends an overload that comes after the 200 as an ``error`` event.
    """

    def _stream_events(self, events: Any, pause: float = 0.0) -> None:
        with self.lock:
            cut = bool(self.cuts) and self.cuts.pop() > 0
        if not cut:
            models._Handler._stream_events(self, events, pause)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        event, data = next(iter(events))
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        for name, payload in ((event, data), ("error", error)):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class _OverloadedServer(FakeModelServer):
    handler = _OverloadedHandler


class _CuttingServer(FakeModelServer):
    handler = _CutHandler


@durably.workflow(name="llm-stream-cut")
async def ask_streamed(question: str) -> str:
    stream = await LLM[0].chat.completions.create(
        model="gpt-4.1-mini", messages=[{"role": "user", "content": question}], stream=True
    )
    async with stream:
        async for _ in stream:
            pass
    assert stream.completion is not None
    return stream.completion.choices[0].message.content or ""


@durably.workflow(name="llm-stream-cut-anthropic")
async def ask_claude_streamed(question: str) -> str:
    stream = await LLM[0].messages.create(
        model="claude-sonnet-4",
        max_tokens=100,
        messages=[{"role": "user", "content": question}],
        stream=True,
    )
    async with stream:
        async for _ in stream:
            pass
    return str(stream.message.content[0].text)


@pytest.mark.parametrize("sync", [False, True])
async def test_a_stream_cut_before_its_end_is_asked_again_not_journaled(
    sqlite_url: str, sync: bool
) -> None:
    _CutHandler.cuts[:] = [1]
    with _CuttingServer(by_turn([text(LONG)])) as server:
        client: Any = (openai.OpenAI if sync else openai.AsyncOpenAI)(
            base_url=server.url, api_key="t", max_retries=0
        )
        LLM[:] = [agents.llm(client, retry=FAST)]
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(ask_streamed, "where?", workflow_id="wf")
            assert await handle.result(timeout=10) == LONG
            history = await engine.history("wf")
        client.close() if sync else await client.close()
        assert len(server.requests) == 2  # the cut answer, then the whole one
    model_steps = [e for e in history if e.name == "llm:chat.completions"]
    assert len(model_steps) == 1


@pytest.mark.parametrize(
    "server_class",
    [_CuttingServer, _OverloadedServer],
    ids=["cut-before-message-stop", "overloaded-inside-the-stream"],
)
async def test_an_anthropic_stream_cut_or_overloaded_is_asked_again(
    sqlite_url: str, server_class: Any
) -> None:
    """A stream cut before ``message_stop``, and an ``error`` event after the 200 (an
    APIStatusError whose status is 200: its type, ``overloaded_error``, says it is
    transient, as a 529 answer would): either way the turn is asked again."""
    anthropic = pytest.importorskip("anthropic")
    _CutHandler.cuts[:] = [1]
    with server_class(by_turn([text(LONG)])) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        LLM[:] = [agents.llm(client, retry=FAST)]
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(ask_claude_streamed, "where?", workflow_id="wf")
            assert await handle.result(timeout=10) == LONG
        await client.close()
        assert len(server.requests) == 2  # the cut or overloaded answer, then the whole one


@durably.workflow(name="agents-sdk-stream-cut")
async def ask_sdk_streamed(question: str) -> str:
    from agents import Agent, OpenAIProvider, RunConfig

    from durably.integrations.openai_agents import DurableRunner

    agent = Agent(name="support", instructions="You are a support agent.", model="gpt-4.1-mini")
    config = RunConfig(model_provider=OpenAIProvider(openai_client=LLM[0].client))
    result = DurableRunner.run_streamed(agent, question, run_config=config, retry=FAST)
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


async def test_an_agents_sdk_stream_cut_before_its_end_is_asked_again(sqlite_url: str) -> None:
    """A Responses API stream that ends before ``response.completed`` is retried."""
    agents_sdk = pytest.importorskip("agents")
    agents_sdk.set_tracing_disabled(True)
    _CutHandler.cuts[:] = [1]
    with _CuttingServer(by_turn([text(LONG)])) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0)
        LLM[:] = [agents.llm(client)]
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(ask_sdk_streamed, "where?", workflow_id="wf")
            assert await handle.result(timeout=10) == LONG
        await client.close()
        assert len(server.requests) == 2  # the cut answer, then the whole one
        assert {r["path"] for r in server.requests} == {"/v1/responses"}
