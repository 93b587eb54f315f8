"""MCP servers of an OpenAI Agents SDK agent, made durable by :class:`DurableMCPServer`.

The SDK asks an agent's MCP servers for their tools before every model turn
(``list_tools``) and turns each into a ``FunctionTool`` whose invocation calls
``server.call_tool``. :class:`DurableMCPServer` stands in for one server in the
durable clone of an agent:

- ``list_tools`` is the step ``mcp:<server>:list_tools``, journaling the MCP
  ``Tool`` definitions as the MCP schema's JSON; on replay they come back
  from the journal and the server is not asked;
- ``call_tool`` is passed through: the ``FunctionTool`` the SDK builds for an
  MCP tool is wrapped like any function tool (the step
  ``tool:<tool name>:<call id>``, approvals on durably's gates), so a call
  completed before a crash is not made again.

Connecting and cleaning up stay the application's (``async with server:``
around the run), as without durably. The stand-in is a shallow copy of the
connected server (sharing its session), so everything else, the server's
approval policy and error handling included, is the server's own.
"""

from __future__ import annotations

import copy
from typing import Any

import mcp.types
from agents.mcp import MCPServer

from durably import context, errors, steps

JSON = dict[str, Any]


def _in_workflow_code() -> bool:
    return context.current_run.get() is not None and context.current_step.get() is None


def durable_server(server: MCPServer) -> MCPServer:
    """A copy of ``server`` whose ``list_tools`` is the step ``mcp:<server>:list_tools``."""
    durable = copy.copy(server)
    listed = server.list_tools
    step = f"mcp:{server.name}:list_tools"

    async def list_tools(run_context: Any = None, agent: Any = None) -> list[mcp.types.Tool]:
        if not _in_workflow_code():
            return await listed(run_context, agent)

        async def list_step() -> list[JSON]:
            tools = await listed(run_context, agent)
            return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

        journaled: list[JSON] = await steps.run_step(list_step, name=step)
        try:
            return [mcp.types.Tool.model_validate(t) for t in journaled]
        except (TypeError, ValueError) as exc:
            raise errors.DecodeError(f"step {step!r}: not a list of MCP tools: {exc}") from exc

    durable.list_tools = list_tools  # type: ignore[method-assign]
    return durable
