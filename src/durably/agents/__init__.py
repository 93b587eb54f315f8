"""Durable agents for OpenAI-compatible models: tools, the agent loop, approvals, usage.

Nothing here is more magic than workflows and steps: a tool is a step, each
model turn is a step, an approval is an event plus a signal. See
docs/agents.md.
"""

import typing

if typing.TYPE_CHECKING:
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

# Each public name is imported from its module on first access, so that
# ``import durably`` (which loads this package for ``durably.Agent`` only when
# used) and the CLI's approval commands do not load the agent loop, the model
# client and the schema machinery they do not need (issue 12).
_LAZY = {
    "Agent": "durably.agents.agent",
    "AgentResult": "durably.agents.agent",
    "Decision": "durably.agents.approvals",
    "PendingApproval": "durably.agents.approvals",
    "args_hash": "durably.agents.approvals",
    "set_budget": "durably.agents.budget",
    "ModelRetry": "durably.agents.completions",
    "approve": "durably.agents.decisions",
    "list_approvals": "durably.agents.decisions",
    "reject": "durably.agents.decisions",
    "DurableLLM": "durably.agents.durable_client",
    "llm": "durably.agents.durable_client",
    "AgentEvent": "durably.agents.events",
    "ApprovalAlreadyDecided": "durably.agents.exceptions",
    "ApprovalError": "durably.agents.exceptions",
    "ApprovalNotPending": "durably.agents.exceptions",
    "ApprovalRejected": "durably.agents.exceptions",
    "ApprovalStale": "durably.agents.exceptions",
    "BudgetExceeded": "durably.agents.exceptions",
    "ClientRetriesWarning": "durably.agents.exceptions",
    "MaxTurnsExceeded": "durably.agents.exceptions",
    "ModelResponseError": "durably.agents.exceptions",
    "OutputValidationError": "durably.agents.exceptions",
    "ToolError": "durably.agents.exceptions",
    "as_tool": "durably.agents.subagents",
    "Tool": "durably.agents.tools",
    "tool": "durably.agents.tools",
    "DEFAULT_PRICES": "durably.agents.usage",
    "Price": "durably.agents.usage",
    "Tokens": "durably.agents.usage",
    "Usage": "durably.agents.usage",
    "run_usage": "durably.agents.usage",
    "usage_from_history": "durably.agents.usage",
}


def __getattr__(name: str) -> typing.Any:
    """Import a lazily loaded public name on first access, then keep it in the package."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'durably.agents' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones included (before their first use too)."""
    return sorted(set(globals()) | set(_LAZY))


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
