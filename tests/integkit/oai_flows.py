"""OpenAI Agents SDK agents, run by DurableRunner, against the fake model server.

``support`` uses the SDK's default: a model name resolved by the provider to
the Responses API model. ``triage`` uses the chat completions model set on the
agents, and hands off to a billing agent. The server's URL comes from
``AGENTKIT_MODEL_URL``; each tool records its effect in ``AGENTKIT_EFFECTS``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    RunContextWrapper,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

import durably
from durably.agents import run_usage
from durably.integrations.openai_agents import DurableRunner
from tests.agentkit.harness import MODEL_URL_ENV
from tests.agentkit.tools import effect

set_tracing_disabled(True)  # the SDK would export traces to api.openai.com
client = AsyncOpenAI(
    base_url=os.environ.get(MODEL_URL_ENV, "http://127.0.0.1:9/v1"), api_key="fake", max_retries=0
)


@function_tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order's status."""
    effect("lookup", order_id=order_id)
    return {"order_id": order_id, "status": "shipped"}


@function_tool(needs_approval=True)
def refund(order_id: str, cents: int) -> dict[str, Any]:
    """Refund part of an order."""
    effect("refund", order_id=order_id, cents=cents)
    return {"refund_id": f"re_{order_id}", "cents": cents}


support_agent = Agent(
    name="support",
    instructions="You are a support agent.",
    model="gpt-4.1-mini",
    tools=[lookup_order, refund],
)


def provider() -> OpenAIProvider:
    return OpenAIProvider(openai_client=client, use_responses=True)


def _report(result: Any) -> dict[str, Any]:
    usage = run_usage()
    return {
        "output": result.final_output,
        "last_agent": result.last_agent.name,
        "billed": dataclasses.asdict(usage.billed),
        "replayed": dataclasses.asdict(usage.replayed),
    }


@durably.workflow(name="oai-support")
async def support(question: str) -> dict[str, Any]:
    result = await DurableRunner.run(
        support_agent, question, run_config=RunConfig(model_provider=provider())
    )
    return _report(result)


def _chat_model() -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel("gpt-4.1-mini", openai_client=client)


billing_agent = Agent(
    name="billing",
    instructions="You handle refunds.",
    model=_chat_model(),
    tools=[refund],
)
triage_agent = Agent(
    name="triage",
    instructions="Look orders up; hand refunds to billing.",
    model=_chat_model(),
    tools=[lookup_order],
    handoffs=[billing_agent],
)


@durably.workflow(name="oai-triage")
async def triage(question: str) -> dict[str, Any]:
    return _report(await DurableRunner.run(triage_agent, question))


@durably.workflow(name="oai-support-dict-config")
async def support_dict_config(question: str) -> dict[str, Any]:
    """The run config as a dict, as ``Runner.run`` also takes it."""
    config = {"model_provider": provider(), "workflow_name": "support"}
    return _report(await DurableRunner.run(support_agent, question, run_config=config))


def _notify_billing(ctx: RunContextWrapper[Any]) -> None:
    """An ``on_handoff`` callback with an effect (a page to the billing team)."""
    effect("handoff", to="billing")


escalating_triage = Agent(
    name="triage",
    instructions="Look orders up; hand refunds to billing.",
    model=_chat_model(),
    tools=[lookup_order],
    handoffs=[handoff(billing_agent, on_handoff=_notify_billing)],
)


@durably.workflow(name="oai-triage-on-handoff")
async def triage_on_handoff(question: str) -> dict[str, Any]:
    return _report(await DurableRunner.run(escalating_triage, question))
