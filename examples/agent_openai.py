"""durably's own Agent over the OpenAI API, against the fake model server.

    python examples/agent_openai.py

Runs a support agent with one tool inside a workflow, then runs the same
workflow id again: the second run returns the journaled answer without asking
the model. Swap the fake server for ``AsyncOpenAI(max_retries=0)`` to use the
real API.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from openai import AsyncOpenAI

import durably
from durably.testing import FakeModelServer, by_turn, call, text, tool_calls
from durably.workflows import WorkflowFunction

SCRIPT = by_turn(
    [tool_calls(call("lookup_order", {"order_id": "A1"})), text("Order A1 has shipped.")]
)


@durably.tool
async def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order's status."""
    return {"order_id": order_id, "status": "shipped"}


def build(client: AsyncOpenAI) -> WorkflowFunction[[str], str]:
    """The support workflow around ``client`` (tests/golden replays its journals)."""
    agent = durably.Agent(
        client=client,
        model="gpt-4.1-mini",
        instructions="You are a support agent.",
        tools=[lookup_order],
    )

    @durably.workflow(name="example-agent-openai")
    async def support(ticket: str) -> str:
        result = await agent.run(ticket)
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
