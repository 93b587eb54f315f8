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
around the run), as without durably.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp.types
from agents.mcp import MCPServer

from durably import context, errors, steps

JSON = dict[str, Any]


def _in_workflow_code() -> bool:
    return context.current_run.get() is not None and context.current_step.get() is None


class DurableMCPServer(MCPServer):
    """An Agents SDK MCP server whose tool listings are durable steps (see the module)."""

    def __init__(self, wrapped: MCPServer) -> None:
        super().__init__(use_structured_content=wrapped.use_structured_content)
        self.wrapped = wrapped
        self.tool_meta_resolver = wrapped.tool_meta_resolver
        self.custom_data_extractor = wrapped.custom_data_extractor
        self.tool_input_guardrails = wrapped.tool_input_guardrails
        self.tool_output_guardrails = wrapped.tool_output_guardrails

    def __repr__(self) -> str:
        return f"<durably DurableMCPServer {self.wrapped.name!r}>"

    @property
    def name(self) -> str:
        """The wrapped server's name (tool names and step names use it)."""
        return self.wrapped.name

    async def connect(self) -> None:
        """Connect the wrapped server."""
        await self.wrapped.connect()  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        """Clean the wrapped server up."""
        await self.wrapped.cleanup()  # type: ignore[no-untyped-call]

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[mcp.types.Tool]:
        """The server's tools: the step ``mcp:<server>:list_tools`` inside a workflow."""
        if not _in_workflow_code():
            return await self.wrapped.list_tools(run_context, agent)

        async def list_step() -> list[JSON]:
            tools = await self.wrapped.list_tools(run_context, agent)
            return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

        step = f"mcp:{self.name}:list_tools"
        listed: list[JSON] = await steps.run_step(list_step, name=step)
        try:
            return [mcp.types.Tool.model_validate(t) for t in listed]
        except (TypeError, ValueError) as exc:
            raise errors.DecodeError(f"step {step!r}: not a list of MCP tools: {exc}") from exc

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> mcp.types.CallToolResult:
        """Call the tool on the wrapped server (inside the tool call's step, see the module)."""
        if meta is None:
            return await self.wrapped.call_tool(tool_name, arguments)
        return await self.wrapped.call_tool(tool_name, arguments, meta=meta)

    @property
    def cached_tools(self) -> list[mcp.types.Tool] | None:
        """The wrapped server's cached tools."""
        return self.wrapped.cached_tools

    async def list_prompts(self) -> mcp.types.ListPromptsResult:
        """The wrapped server's prompts (not journaled: the SDK's run does not ask for them)."""
        return await self.wrapped.list_prompts()

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> mcp.types.GetPromptResult:
        """One prompt of the wrapped server (not journaled)."""
        return await self.wrapped.get_prompt(name, arguments)

    def _get_needs_approval_for_tool(
        self, tool: mcp.types.Tool, agent: Any
    ) -> bool | Callable[[Any, dict[str, Any], str], Awaitable[bool]]:
        # the wrapped server's approval policy, applied by durably's gates (see the module)
        return self.wrapped._get_needs_approval_for_tool(tool, agent)

    def _get_failure_error_function(self, agent_failure_error_function: Any) -> Any:
        return self.wrapped._get_failure_error_function(agent_failure_error_function)
