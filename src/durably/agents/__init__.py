"""Durable agents for OpenAI-compatible models: tools, the agent loop, approvals, usage.

Nothing here is more magic than workflows and steps: a tool is a step, each
model turn is a step, an approval is an event plus a signal. See
docs/agents.md.
"""

from durably.agents.agent import Agent, AgentResult
from durably.agents.approvals import Decision, PendingApproval, args_hash
from durably.agents.budget import set_budget
from durably.agents.completions import ModelRetry
from durably.agents.decisions import approve, list_approvals, reject
from durably.agents.durable_client import DurableLLM, llm
from durably.agents.events import AgentEvent
from durably.agents.exceptions import (
    ApprovalAlreadyDecided,
    ApprovalError,
    ApprovalNotPending,
    ApprovalRejected,
    ApprovalStale,
    BudgetExceeded,
    ClientRetriesWarning,
    MaxTurnsExceeded,
    ModelResponseError,
    OutputValidationError,
    ToolError,
)
from durably.agents.subagents import as_tool
from durably.agents.tools import Tool, tool
from durably.agents.usage import (
    DEFAULT_PRICES,
    Price,
    Tokens,
    Usage,
    run_usage,
    usage_from_history,
)

__all__ = [
    "DEFAULT_PRICES",
    "Agent",
    "AgentEvent",
    "AgentResult",
    "ApprovalAlreadyDecided",
    "ApprovalError",
    "ApprovalNotPending",
    "ApprovalRejected",
    "ApprovalStale",
    "BudgetExceeded",
    "ClientRetriesWarning",
    "Decision",
    "DurableLLM",
    "MaxTurnsExceeded",
    "ModelResponseError",
    "ModelRetry",
    "OutputValidationError",
    "PendingApproval",
    "Price",
    "Tokens",
    "Tool",
    "ToolError",
    "Usage",
    "approve",
    "args_hash",
    "as_tool",
    "list_approvals",
    "llm",
    "reject",
    "run_usage",
    "set_budget",
    "tool",
    "usage_from_history",
]
