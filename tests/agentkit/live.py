"""In-process agent tests: a fake model server, a real openai client, an Engine, one agent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

import openai

import durably
from durably import agents
from durably.testing.models import FakeModelServer, Script, by_turn
from tests.agentkit import rawclient

CURRENT: list[agents.Agent] = []


@durably.workflow(name="agentkit-live")
async def run_agent(question: str) -> dict[str, Any]:
    """Run the current test's agent and report everything a test may check."""
    result = await CURRENT[0].run(question)
    return {
        "output": result.output,
        "messages": result.messages,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "usage": dataclasses.asdict(result.usage),
        "summary": result.usage.summary(),
    }


@dataclasses.dataclass
class Live:
    server: FakeModelServer
    engine: durably.Engine
    agent: agents.Agent

    async def start(self, question: str = "help", wid: str = "wf") -> durably.WorkflowHandle:
        return await self.engine.start(run_agent, question, workflow_id=wid)

    async def run(self, question: str = "help", wid: str = "wf") -> dict[str, Any]:
        result: dict[str, Any] = await (await self.start(question, wid)).result(timeout=20)
        return result

    def tool_messages(self, n: int = -1) -> list[dict[str, Any]]:
        """The tool messages of the n-th request the server received."""
        return [m for m in self.server.requests[n]["body"]["messages"] if m["role"] == "tool"]


@contextlib.asynccontextmanager
async def live(
    url: str,
    script: Script | Sequence[Any],
    tools: Sequence[Any] = (),
    *,
    client: str = "async",
    **agent_options: Any,
) -> AsyncIterator[Live]:
    """Serve ``script`` (a list is answered by turn), build the agent, open an engine.

    ``client`` is "async" (AsyncOpenAI), "sync" (OpenAI) or "raw" (see rawclient).
    """
    chosen = by_turn(script) if isinstance(script, list | tuple) else script
    with FakeModelServer(chosen) as server:
        made: Any
        if client == "sync":
            made = openai.OpenAI(base_url=server.url, api_key="t", max_retries=0)
        elif client == "raw":
            made = rawclient.RawClient(server.url)
        else:
            made = openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0)
        try:
            options = {"model": "gpt-4.1-mini", **agent_options}
            CURRENT[:] = [agents.Agent(client=made, tools=tools, **options)]
            async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1) as engine:
                yield Live(server, engine, CURRENT[0])
        finally:
            if client == "async":
                await made.close()
            else:
                made.close()


async def until(handle: durably.WorkflowHandle, status: str, timeout: float = 10.0) -> None:
    """Wait until the workflow's status is ``status``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (now := await handle.status()) != status:
        assert loop.time() < deadline, f"still {now}"
        await asyncio.sleep(0.02)
