"""A Pydantic AI model request that fails on the connection is retried by the model step.

Pydantic AI turns the openai client's ``APIConnectionError`` into its own
``ModelConnectionError`` (not a ``ConnectionError``, no status code); the
model step's :class:`~durably.agents.ModelRetry` must still see it as
transient, as it does for durably's own Agent, instead of failing the run.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

pytest.importorskip("pydantic_ai")

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import durably
from durably import agents
from durably.integrations.pydantic_ai import DurableAgent
from durably.testing import models
from durably.testing.models import FakeModelServer, by_turn, text

FAST = agents.ModelRetry(initial=0.05, max_delay=0.1)
client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="fake", max_retries=0)
durable = DurableAgent(
    Agent(OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client))),
    retry=FAST,
)


class _DroppingHandler(models._Handler):
    """Closes the connection of the first requests without an answer (not logged)."""

    drops: ClassVar[list[int]] = []
    dropped: ClassVar[list[int]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        with self.lock:
            drop = bool(self.drops) and self.drops.pop() > 0
        if not drop:
            super().do_POST()
            return
        self.dropped.append(1)
        self.close_connection = True  # nothing written: the client sees the server hang up


class _DroppingServer(FakeModelServer):
    handler = _DroppingHandler


@durably.workflow(name="pai-retry-connection")
async def ask(question: str) -> str:
    return str((await durable.run(question)).output)


async def test_a_connection_error_is_retried_not_final(sqlite_url: str) -> None:
    _DroppingHandler.drops[:] = [1]
    _DroppingHandler.dropped.clear()
    with _DroppingServer(by_turn([text("It shipped.")])) as server:
        client.base_url = server.url  # type: ignore[assignment]
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(ask, "where?", workflow_id="wf")
            assert await handle.result(timeout=10) == "It shipped."
        assert _DroppingHandler.dropped == [1]
        assert len(server.requests) == 1  # the retry, answered


async def test_a_429s_retry_after_is_waited_for(sqlite_url: str) -> None:
    """Pydantic AI raises its own ModelHTTPError, its headers on the error itself (not on
    a ``response``): the model step still waits the delay the server asked for, not its
    own (50 ms here), before it asks again."""
    with FakeModelServer(by_turn([text("It shipped.")])) as server:
        server.fail_next(models.failure(429, retry_after=0.6))
        client.base_url = server.url  # type: ignore[assignment]
        async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(ask, "where?", workflow_id="wf-429")
            assert await handle.result(timeout=10) == "It shipped."
        tries = server.requests
    assert [r["status"] for r in tries] == [429, 200]
    assert tries[1]["ts"] - tries[0]["ts"] >= 0.55
