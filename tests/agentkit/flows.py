"""The agent and workflow that the child processes run.

The model is reached at ``AGENTKIT_MODEL_URL`` (a FakeModelServer in the test
process); every tool effect is appended, fsync'd, to ``AGENTKIT_EFFECTS`` so a
test counts what really ran. ``AGENTKIT_DELAYS`` (JSON ``{name: seconds}``)
overrides how long ``work`` takes, so a restarted process can finish parallel
calls in another order.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import anthropic
import openai
import pydantic

import durably
from durably import agents
from tests.agentkit import harness
from tests.agentkit.tools import lookup_order, refund, work

client = openai.AsyncOpenAI(
    base_url=os.environ.get(harness.MODEL_URL_ENV, "http://127.0.0.1:9/v1"),
    api_key="test",
    max_retries=0,
)
agent = agents.Agent(
    client=client,
    model="gpt-4.1-mini",
    instructions="You are a support agent.",
    tools=[lookup_order, refund, work],
    max_turns=50,
    max_tokens=int(os.environ[harness.MAX_TOKENS_ENV])
    if harness.MAX_TOKENS_ENV in os.environ
    else None,
)


anthropic_client = anthropic.AsyncAnthropic(
    base_url=os.environ.get(harness.MODEL_URL_ENV, "http://127.0.0.1:9/v1").removesuffix("/v1"),
    api_key="test",
    max_retries=0,
)
anthropic_agent = agents.Agent(
    client=anthropic_client,
    model="claude-sonnet-4-6",
    instructions="You are a support agent.",
    tools=[lookup_order, refund, work],
    max_turns=50,
    name="claude-agent",
)


@durably.workflow(name="agentkit-support-anthropic")
async def support_anthropic(question: str) -> dict[str, Any]:
    """The same support agent over Anthropic's Messages API."""
    result = await anthropic_agent.run(question)
    return {
        "output": result.output,
        "turns": result.turns,
        "billed": dataclasses.asdict(result.usage.billed),
        "replayed": dataclasses.asdict(result.usage.replayed),
        "summary": result.usage.summary(),
        "tool_messages": [m for m in result.messages if m["role"] == "tool"],
    }


researcher = agents.Agent(
    client=client,
    model="gpt-4.1-mini",
    instructions="You research orders.",
    tools=[lookup_order],
    name="researcher",
)
team_lead = agents.Agent(
    client=client,
    model="gpt-4.1-mini",
    instructions="You lead the support team.",
    tools=[agents.as_tool(researcher, description="Ask the researcher about orders.")],
    name="team-lead",
)


@durably.workflow(name="agentkit-support-team")
async def support_team(question: str) -> dict[str, Any]:
    """A lead agent that asks a researcher sub-agent (a durable child workflow)."""
    result = await team_lead.run(question)
    return {
        "output": result.output,
        "turns": result.turns,
        "billed": dataclasses.asdict(result.usage.billed),
        "replayed": dataclasses.asdict(result.usage.replayed),
        "summary": result.usage.summary(),
        "tool_messages": [m for m in result.messages if m["role"] == "tool"],
    }


@durably.workflow(name="agentkit-support")
async def support(question: str) -> dict[str, Any]:
    """Answer a support question with the agent; report what it cost."""
    result = await agent.run(question)
    return {
        "output": result.output,
        "turns": result.turns,
        "billed": dataclasses.asdict(result.usage.billed),
        "replayed": dataclasses.asdict(result.usage.replayed),
        "summary": result.usage.summary(),
        "tool_messages": [m for m in result.messages if m["role"] == "tool"],
    }


class Verdict(pydantic.BaseModel):
    """The structured answer of ``support_verdict``."""

    order_id: str
    refund_cents: int


verdict_agent = agents.Agent(
    client=client,
    model="gpt-4.1-mini",
    instructions="You decide refunds.",
    output_type=Verdict,
    output_retries=3,
    name="verdict",
)


@durably.workflow(name="agentkit-support-verdict")
async def support_verdict(question: str) -> dict[str, Any]:
    """A structured answer (validated, asked again when it does not fit)."""
    result = await verdict_agent.run(question)
    return {
        "output": result.output.model_dump(),
        "turns": result.turns,
        "billed": dataclasses.asdict(result.usage.billed),
        "replayed": dataclasses.asdict(result.usage.replayed),
    }
