"""A Pydantic AI agent made durable by wrapping it, against the fake model server.

    python examples/pydantic_ai_agent.py

``DurableAgent(agent)`` makes every model request and tool call of the agent a
durable step inside a workflow; the agent itself is unchanged. Needs the extra:
``pip install "durably[pydantic-ai]"``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import durably
from durably.integrations.pydantic_ai import DurableAgent
from durably.testing import FakeModelServer, by_turn, call, text, tool_calls
from durably.workflows import WorkflowFunction

SCRIPT = by_turn(
    [tool_calls(call("lookup_order", {"order_id": "A1"})), text("Order A1 has shipped.")]
)


def build(client: AsyncOpenAI) -> WorkflowFunction[[str], str]:
    """The support workflow around ``client`` (tests/golden replays its journals)."""
    agent = Agent(
        OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client)),
        instructions="You are a support agent.",
    )

    @agent.tool_plain
    def lookup_order(order_id: str) -> dict[str, str]:
        """Look up an order's status."""
        return {"order_id": order_id, "status": "shipped"}

    durable_agent = DurableAgent(agent, max_cost=1.00)  # parks for a person at $1

    @durably.workflow(name="example-pydantic-ai")
    async def support(ticket: str) -> str:
        result = await durable_agent.run(ticket)
        return str(result.output)

    return support


def main(database: str | None = None) -> None:
    with FakeModelServer(SCRIPT) as server, tempfile.TemporaryDirectory() as tmp:
        support = build(AsyncOpenAI(base_url=server.url, api_key="fake", max_retries=0))
        database = database or f"sqlite:///{Path(tmp) / 'example.db'}"
        answer = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"answer: {answer}")
        print(f"model requests: {len(server.requests)}")
        again = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"run again: {again} (model requests: {len(server.requests)})")


if __name__ == "__main__":
    main()
