"""A Pydantic AI agent whose tools come from a real MCP server (stdio), wrapped by DurableAgent.

The model is the fake server's (``AGENTKIT_MODEL_URL``); the MCP server is
tests/integkit/mcp_orders.py as a subprocess, logging each ``tools/list`` and
``tools/call`` to ``AGENTKIT_MCP_LOG``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from fastmcp.client.transports import StdioTransport
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import durably
from durably.agents import run_usage
from durably.integrations.pydantic_ai import DurableAgent
from tests.agentkit import harness

MCP_LOG_ENV = "AGENTKIT_MCP_LOG"

client = AsyncOpenAI(
    base_url=os.environ.get(harness.MODEL_URL_ENV, "http://127.0.0.1:9/v1"),
    api_key="fake",
    max_retries=0,
)


def orders_server(log: str) -> MCPToolset[Any]:
    """The orders MCP server as a stdio subprocess (started when the run enters it)."""
    transport = StdioTransport(
        command=sys.executable, args=["-m", "tests.integkit.mcp_orders", log], cwd=str(harness.REPO)
    )
    return MCPToolset(transport, id="orders")


def build(log: str) -> DurableAgent:
    """The wrapped agent, its MCP server logging to ``log``."""
    agent = Agent(
        OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client)),
        instructions="Ship orders with the MCP tools.",
        toolsets=[orders_server(log)],
    )
    return DurableAgent(agent)


DURABLE = [build(os.environ.get(MCP_LOG_ENV, os.devnull))]


@durably.workflow(name="pai-mcp")
async def ship(question: str) -> dict[str, Any]:
    result = await DURABLE[0].run(question)
    usage = run_usage()
    return {
        "output": result.output,
        "billed": dataclasses.asdict(usage.billed),
        "replayed": dataclasses.asdict(usage.replayed),
    }
