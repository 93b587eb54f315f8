"""An OpenAI Agents SDK agent run durably with DurableRunner, against the fake model server.

    python examples/openai_agents_sdk.py

``DurableRunner.run(agent, input)`` in place of ``Runner.run``: every model
call (the Responses API, the SDK's default) and function tool call is a durable
step inside the workflow. Needs the extra: ``pip install "durably[openai-agents]"``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from agents import Agent, OpenAIProvider, RunConfig, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import durably
from durably.integrations.openai_agents import DurableRunner
from durably.testing import FakeModelServer, by_turn, call, text, tool_calls
from durably.workflows import WorkflowFunction

SCRIPT = by_turn(
    [tool_calls(call("lookup_order", {"order_id": "A1"})), text("Order A1 has shipped.")]
)


@function_tool
def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order's status."""
    return {"order_id": order_id, "status": "shipped"}


agent = Agent(
    name="support",
    instructions="You are a support agent.",
    model="gpt-4.1-mini",
    tools=[lookup_order],
)


def build(client: AsyncOpenAI) -> WorkflowFunction[[str], str]:
    """The support workflow around ``client`` (tests/golden replays its journals)."""
    set_tracing_disabled(True)  # the SDK would export traces to api.openai.com
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))

    @durably.workflow(name="example-openai-agents")
    async def support(ticket: str) -> str:
        result = await DurableRunner.run(agent, ticket, run_config=config, max_cost=1.00)
        return str(result.final_output)

    return support


def main(database: str | None = None) -> None:
    with FakeModelServer(SCRIPT) as server, tempfile.TemporaryDirectory() as tmp:
        support = build(AsyncOpenAI(base_url=server.url, api_key="fake", max_retries=0))
        database = database or f"sqlite:///{Path(tmp) / 'example.db'}"
        answer = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"answer: {answer}")
        print(f"model requests: {len(server.requests)} to {server.requests[0]['path']}")
        again = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"run again: {again} (model requests: {len(server.requests)})")


if __name__ == "__main__":
    main()
