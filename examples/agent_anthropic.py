"""durably's own Agent over Anthropic's Messages API, natively, against the fake model server.

    python examples/agent_anthropic.py

The same support agent as agent_openai.py with an ``AsyncAnthropic`` client:
tool_use blocks, stop reasons and cache tokens are handled natively, and each
turn is journaled in the provider-neutral shape. With ``stream=True`` the
answer's text reaches ``on_event`` in pieces while the model step runs (live
only: a replayed turn's text comes once, whole, marked replayed). Swap the fake
server for ``AsyncAnthropic(max_retries=0)`` to use the real API.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from anthropic import AsyncAnthropic

import durably
from durably.testing import FakeModelServer, by_turn, call, text, tool_calls

SCRIPT = by_turn(
    [tool_calls(call("lookup_order", {"order_id": "A1"})), text("Order A1 has shipped.")]
)


@durably.tool
async def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order's status."""
    return {"order_id": order_id, "status": "shipped"}


def main() -> None:
    with FakeModelServer(SCRIPT) as server, tempfile.TemporaryDirectory() as tmp:
        client = AsyncAnthropic(base_url=server.anthropic_url, api_key="fake", max_retries=0)
        agent = durably.Agent(
            client=client,
            model="claude-sonnet-4-5",
            instructions="You are a support agent.",
            tools=[lookup_order],
            stream=True,
        )
        pieces: list[durably.agents.AgentEvent] = []

        @durably.workflow(name="example-agent-anthropic")
        async def support(ticket: str) -> str:
            result = await agent.run(ticket, on_event=pieces.append)
            return str(result.output)

        database = f"sqlite:///{Path(tmp) / 'example.db'}"
        answer = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"answer: {answer}")
        print(f"model requests: {len(server.requests)} to {server.requests[0]['path']}")
        again = durably.run(support, "Where is order A1?", workflow_id="t-1", database=database)
        print(f"run again: {again} (model requests: {len(server.requests)})")
        live = [e.text for e in pieces if e.kind == "text" and not e.replayed]
        print(f"streamed live: {live}")


if __name__ == "__main__":
    main()
