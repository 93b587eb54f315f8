"""Sub-agents: an agent used as a tool of another runs as a durable child workflow.

``as_tool(researcher)`` makes a tool the parent agent can call with
``{"input": "..."}``. Each call starts the child workflow
``<parent id>:agent:<tool_call_id>`` (suffixed ``#2``, ``#3``... when a
provider reuses a call id; the registered workflow ``durably-subagent``),
which runs ``researcher.run(input)`` with its own journal: a crash in the
middle replays the child's completed turns from the child's journal, never
asks them again. The child's answer (its output as text, or as
JSON for a structured output) is the tool's result; its usage rolls up into the
parent's run (as billed or replayed, the way the child's run counted it, and
as replayed when the parent replays the finished child).

The child finds the agent by its name in this process, so a sub-agent must be
created (and ``as_tool`` called) at import time, like a workflow.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from durably import context, errors, journal, waits, workflows
from durably.agents import schema, tools, usage

if TYPE_CHECKING:
    from durably.agents.agent import Agent

_AGENTS: dict[str, Agent] = {}
_CHILD_IDS = "durably.agents.subagents:child ids"  # Run.local key: the ids used this run


@workflows.workflow(name="durably-subagent")
async def run_subagent(agent_name: str, input: str) -> dict[str, Any]:
    """The child workflow of one sub-agent call: the agent's run, its output and usage."""
    agent = _AGENTS.get(agent_name)
    if agent is None:
        raise errors.DefinitionError(
            f"no sub-agent named {agent_name!r} in this process; create it and call "
            "durably.agents.as_tool(...) at import time"
        )
    result = await agent.run(input)
    output = result.output
    text = output if isinstance(output, str) else json.dumps(schema.to_json(output))
    meter = usage.run_meter()
    return {
        "output": text,
        "billed": _counts(result.usage.billed),
        "replayed": _counts(result.usage.replayed),
        # requests whose answers a crash lost, and every request priced (what budgets
        # count): the asking agent's usage holds them as its own calls' would
        "interrupted": result.usage.interrupted,
        "charged": None if meter is None else _counts(meter.charged),
    }


def _counts(tokens: usage.Tokens) -> dict[str, Any]:
    return {
        "calls": tokens.calls,
        "prompt_tokens": tokens.prompt_tokens,
        "completion_tokens": tokens.completion_tokens,
        "cached_tokens": tokens.cached_tokens,
        "cost": tokens.cost,
        "unpriced_calls": tokens.unpriced_calls,
        "cache_write_tokens": tokens.cache_write_tokens,
    }


def _tokens(data: Any) -> usage.Tokens:
    if not isinstance(data, dict):
        return usage.Tokens()
    return usage.Tokens(
        int(data.get("calls") or 0),
        int(data.get("prompt_tokens") or 0),
        int(data.get("completion_tokens") or 0),
        int(data.get("cached_tokens") or 0),
        float(data.get("cost") or 0.0),
        int(data.get("unpriced_calls") or 0),
        int(data.get("cache_write_tokens") or 0),
    )


class SubAgentTool(tools.Tool[..., Any]):
    """A tool whose calls run an agent as a durable child workflow (see the module)."""

    def __init__(self, agent: Agent, name: str, description: str) -> None:
        async def ask(input: str) -> str:
            raise AssertionError("a sub-agent tool runs as a child workflow")  # pragma: no cover

        ask.__name__ = name
        ask.__doc__ = f"{description}\n\nArgs:\n    input: What to ask {name}."
        super().__init__(ask, tools.ToolOptions(name=name, description=description))
        _AGENTS[name] = agent  # the last one made under a name is the one children run
        self.agent = agent

    def call_for_model(self, call_id: str, kwargs: dict[str, Any]) -> Any:
        """Start the child and take its join's seq now (program order); await its answer."""
        run = context.require_run("a sub-agent call")
        base = f"{run.workflow_id}:agent:{call_id}"
        used: set[str] = run.local(_CHILD_IDS, set)
        child_id, n = base, 1
        while child_id in used:  # a provider that reuses (or omits) call ids: a child each
            n += 1
            child_id = f"{base}#{n}"
        used.add(child_id)
        started = waits.start_child(
            run_subagent, self.name, str(kwargs.get("input") or ""), workflow_id=child_id
        )
        joining = waits.ChildHandle(child_id).result()
        join_seq = run.last_seq
        recorded = run.recorded(join_seq, journal.Kind.JOIN, child_id)
        replayed = recorded is not None and recorded.status == journal.EntryStatus.COMPLETED
        meters = (usage.run_meter(), usage.agent_meter.get())

        async def answer() -> str:
            await started
            out = await joining
            if not isinstance(out, dict):
                raise errors.DecodeError(f"sub-agent {self.name!r} returned {out!r}")
            billed, again = _tokens(out.get("billed")), _tokens(out.get("replayed"))
            # a child recorded before it reported them: no lost requests known
            charged = _tokens(out["charged"]) if out.get("charged") else billed + again
            lost = int(out.get("interrupted") or 0)
            for meter in meters:
                if meter is None:
                    continue
                if replayed:
                    meter.replayed += billed + again
                else:
                    meter.billed += billed
                    meter.replayed += again
                meter.charged += charged
                meter.interrupted += lost
            return str(out.get("output") or "")

        return answer()


def as_tool(agent: Agent, *, name: str | None = None, description: str | None = None) -> Any:
    """The tool through which another agent asks ``agent`` (a durable child workflow per call)."""
    chosen = name or agent.name
    return SubAgentTool(agent, chosen, description or f"Ask the {chosen} agent.")
