"""More OpenAI Agents SDK flows for DurableRunner: MCP servers, a hand-built Handoff,
``run_streamed``. The model is the chat completions model on the fake server
(``AGENTKIT_MODEL_URL``); tool effects go to ``AGENTKIT_EFFECTS``; the MCP
server (tests/integkit/mcp_orders.py, a real stdio subprocess) logs its calls
to ``AGENTKIT_MCP_LOG``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Handoff,
    RunConfig,
    RunContextWrapper,
    SQLiteSession,
    input_guardrail,
    output_guardrail,
)
from agents.mcp import MCPServerStdio
from agents.memory import OpenAIConversationsSession

import durably
from durably.integrations.openai_agents import DurableRunner
from tests.agentkit import harness
from tests.agentkit.tools import effect
from tests.integkit.oai_flows import (
    _chat_model,
    _report,
    billing_agent,
    client,
    lookup_order,
    provider,
)

__all__ = ["client"]  # closed by tests.integkit.runner

MCP_LOG_ENV = "AGENTKIT_MCP_LOG"
SESSION_DB_ENV = "AGENTKIT_SESSION_DB"  # the SQLiteSession's file
STREAMED: list[dict[str, Any]] = []  # what the streamed flow saw, for in-process tests


def mcp_server(**options: Any) -> MCPServerStdio:
    """The orders MCP server as a stdio subprocess, logging to ``AGENTKIT_MCP_LOG``."""
    log = os.environ.get(MCP_LOG_ENV, os.devnull)
    params = {"command": sys.executable, "args": ["-m", "tests.integkit.mcp_orders", log]}
    return MCPServerStdio(params={**params, "cwd": str(harness.REPO)}, name="orders", **options)


@durably.workflow(name="oai-mcp")
async def mcp_orders(question: str) -> dict[str, Any]:
    async with mcp_server() as server:
        agent = Agent(
            name="shipping",
            instructions="Ship orders with the MCP tools.",
            model=_chat_model(),
            mcp_servers=[server],
        )
        return _report(await DurableRunner.run(agent, question))


@durably.workflow(name="oai-mcp-gated")
async def mcp_gated(question: str) -> dict[str, Any]:
    """The MCP server's own approval policy: every call waits for a person."""
    async with mcp_server(require_approval="always") as server:
        agent = Agent(name="shipping", model=_chat_model(), mcp_servers=[server])
        return _report(await DurableRunner.run(agent, question))


async def _escalate(ctx: RunContextWrapper[Any], input_json: str) -> Agent[Any]:
    """A hand-built Handoff's on_invoke_handoff, with an effect (a page to billing)."""
    effect("handoff", to="billing", args=json.loads(input_json or "{}"))
    return billing_agent


escalate = Handoff(
    tool_name="escalate_to_billing",
    tool_description="Hand the conversation to billing.",
    input_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
    on_invoke_handoff=_escalate,
    agent_name="billing",
)
hand_built_triage = Agent(
    name="triage",
    instructions="Look orders up; escalate refunds to billing.",
    model=_chat_model(),
    tools=[lookup_order],
    handoffs=[escalate],
)


@durably.workflow(name="oai-hand-built-handoff")
async def hand_built(question: str) -> dict[str, Any]:
    result = await DurableRunner.run(hand_built_triage, question, handoff_agents=[billing_agent])
    return _report(result)


@durably.workflow(name="oai-hand-built-unknown")
async def hand_built_unknown(question: str) -> dict[str, Any]:
    """The same graph without ``handoff_agents``: billing cannot be found on replay."""
    return _report(await DurableRunner.run(hand_built_triage, question))


streaming_support = Agent(
    name="support",
    instructions="You are a support agent.",
    model=_chat_model(),
    tools=[lookup_order],
)


@durably.workflow(name="oai-streamed")
async def streamed(question: str) -> dict[str, Any]:
    return await _streamed(DurableRunner.run_streamed(streaming_support, question))


responses_support = Agent(
    name="support",
    instructions="You are a support agent.",
    model="gpt-4.1-mini",  # the SDK's default: the Responses API model
    tools=[lookup_order],
)


@durably.workflow(name="oai-streamed-responses")
async def streamed_responses(question: str) -> dict[str, Any]:
    config = RunConfig(model_provider=provider())
    return await _streamed(
        DurableRunner.run_streamed(responses_support, question, run_config=config)
    )


async def _streamed(result: Any) -> dict[str, Any]:
    async for event in result.stream_events():
        if event.type != "raw_response_event":
            continue
        data = event.data
        if data.type == "response.output_text.delta":
            STREAMED.append({"delta": data.delta})
        elif data.type == "response.completed":
            STREAMED.append({"completed": (data.response.metadata or {}).get("durably", "live")})
    await durably.wait_for_signal("go")
    return _report(result)


@durably.workflow(name="oai-session")
async def session_orders(question: str) -> dict[str, Any]:
    """A run whose conversation the SDK keeps in a session: its SQLiteSession, a file."""
    session = SQLiteSession("conversation-1", os.environ[SESSION_DB_ENV])
    agent = Agent(name="support", model=_chat_model(), tools=[lookup_order])
    return _report(await DurableRunner.run(agent, question, session=session))


@durably.workflow(name="oai-conversations-session")
async def conversations_session(question: str) -> dict[str, Any]:
    """A session kept on OpenAI's side: refused, not wrapped."""
    session = OpenAIConversationsSession(openai_client=client)
    agent = Agent(name="support", model=_chat_model(), tools=[lookup_order])
    return _report(await DurableRunner.run(agent, question, session=session))


@input_guardrail
async def screen_question(ctx: RunContextWrapper[Any], agent: Agent[Any], given: Any) -> Any:
    """An input guardrail with an effect of its own (as one that asks a model has)."""
    effect("screen_question", given=str(given))
    return GuardrailFunctionOutput({"checked": str(given)}, tripwire_triggered="refund" in given)


@output_guardrail
async def screen_answer(ctx: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> Any:
    effect("screen_answer", output=str(output))
    return GuardrailFunctionOutput({"length": len(str(output))}, tripwire_triggered=False)


@durably.workflow(name="oai-guarded")
async def guarded_orders(question: str) -> dict[str, Any]:
    """A run whose agent screens its input (alongside the first turn) and its answer."""
    agent = Agent(
        name="support",
        model=_chat_model(),
        tools=[lookup_order],
        input_guardrails=[screen_question],
        output_guardrails=[screen_answer],
    )
    result = await DurableRunner.run(agent, question)
    report = _report(result)
    report["screened"] = [r.output.output_info for r in result.input_guardrail_results]
    return report
