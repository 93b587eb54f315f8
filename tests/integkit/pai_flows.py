"""A Pydantic AI agent with two tools, wrapped by DurableAgent, against the fake model server.

The server's URL comes from ``AGENTKIT_MODEL_URL``; each tool records its
effect in ``AGENTKIT_EFFECTS`` (see tests/agentkit/tools.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage

import durably
from durably.agents import run_usage
from durably.integrations.pydantic_ai import DurableAgent
from tests.agentkit.harness import MAX_TOKENS_ENV, MODEL_URL_ENV
from tests.agentkit.tools import effect

client = AsyncOpenAI(
    base_url=os.environ.get(MODEL_URL_ENV, "http://127.0.0.1:9/v1"), api_key="fake", max_retries=0
)
agent = Agent(
    OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client)),
    instructions="You are a support agent.",
)


@agent.tool_plain
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order's status."""
    effect("lookup", order_id=order_id)
    return {"order_id": order_id, "status": "shipped"}


@agent.tool_plain(requires_approval=True)
def refund(order_id: str, cents: int) -> dict[str, Any]:
    """Refund part of an order."""
    effect("refund", order_id=order_id, cents=cents)
    return {"refund_id": f"re_{order_id}", "cents": cents}


durable = DurableAgent(agent)


@durably.workflow(name="pai-support")
async def support(question: str) -> dict[str, Any]:
    result = await durable.run(question)
    usage = run_usage()
    return {
        "output": result.output,
        "billed": dataclasses.asdict(usage.billed),
        "replayed": dataclasses.asdict(usage.replayed),
    }


@durably.workflow(name="pai-support-stream")
async def support_streamed(question: str) -> str:
    """The same agent through ``run_stream_events``-free streaming: an event handler."""
    seen: list[str] = []

    async def handler(ctx: Any, events: Any) -> None:
        async for event in events:
            seen.append(type(event).__name__)

    result = await durable.run(question, event_stream_handler=handler)
    return f"{result.output} ({len(seen)} events)"


@durably.workflow(name="pai-support-budget")
async def support_budget(question: str) -> dict[str, Any]:
    """``support`` with ``max_tokens`` from ``AGENTKIT_MAX_TOKENS`` for this run."""
    max_tokens = int(os.environ[MAX_TOKENS_ENV])
    result = await durable.run(question, max_tokens=max_tokens)
    return {"output": result.output}


@durably.workflow(name="pai-support-live-events")
async def support_live_events(question: str) -> dict[str, Any]:
    """Each text delta with the number of model turns the journal had finished when it came."""
    deltas: list[tuple[str, int]] = []

    async def handler(ctx: Any, events: Any) -> None:
        async for event in events:
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                piece: Any = event.part.content
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                piece = event.delta.content_delta
            else:
                continue
            if piece:
                usage = run_usage()
                deltas.append((piece, usage.billed.calls + usage.replayed.calls))

    result = await durable.run(question, event_stream_handler=handler)
    return {"output": result.output, "deltas": deltas}


class CountingModel(OpenAIChatModel):
    """A model that counts a request's tokens ahead of it, as some providers' do (a
    request of its own to the provider: here, an effect)."""

    async def count_tokens(self, messages: Any, model_settings: Any, params: Any) -> RequestUsage:
        effect("count_tokens", messages=len(messages))
        return RequestUsage(input_tokens=100 * len(messages))


counting = Agent(
    CountingModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=client)),
    instructions="You are a support agent.",
    tools=[lookup_order],
)


@durably.workflow(name="pai-counted")
async def counted_support(question: str) -> dict[str, Any]:
    """Each request's tokens counted before it is sent (``count_tokens_before_request``)."""
    limits = UsageLimits(count_tokens_before_request=True, input_tokens_limit=100_000)
    result = await DurableAgent(counting).run(question, usage_limits=limits)
    return {"output": result.output, "input_tokens": result.usage.input_tokens}
