"""Pydantic AI agents made durable by wrapping: ``DurableAgent(agent)``.

Inside a ``@durably.workflow``::

    result = await DurableAgent(agent).run("Where is my order?")
    return result.output

Built on Pydantic AI's public wrapper classes, as its own DBOS and Temporal
wrappers are:

- :class:`DurableModel` (a ``WrapperModel``): every model request, streamed or
  not, is the step ``llm:pydantic_ai`` (a streamed request's events reach the
  caller's ``event_stream_handler`` while the step runs; a replayed turn's
  parts come once, after it). Its result is the response in Pydantic
  AI's own serialization (``ModelMessagesTypeAdapter``), never a class path,
  with its usage in the shape :mod:`durably.agents.usage` reads; on replay the
  response comes back from the journal and the provider is not asked.
- :class:`DurableToolset` (a ``WrapperToolset``): every tool call is the step
  ``tool:<tool name>:<tool call id>``. A tool declared with
  ``requires_approval=True`` does not end the run with deferred requests: the
  workflow parks on durably's approvals (bound to the arguments, decided once
  from any process with ``durably approve`` / ``engine.approve``), and a
  rejection reaches the model as the tool's result.
- MCP servers (Pydantic AI's ``MCPToolset``, among the agent's toolsets or
  nested in them): the tool listing asked before each model turn is the step
  ``mcp:<toolset id>:list_tools`` (the tool definitions, as Pydantic AI's
  JSON), and each MCP tool call is a tool step like any other, so a call
  completed before a crash is not made again. The server is still entered
  (connected) by the run, as without durably.

Tool calls run one at a time (Pydantic AI's ``sequential`` mode), so their
steps take their seqs in the model's order on every replay. Usage feeds the
run's billed/replayed meter (:func:`durably.agents.run_usage`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import pydantic
import pydantic_core
from pydantic_ai import Agent, ApprovalRequired, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ModelResponseStreamEvent,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_ai.usage import RequestUsage

from durably import context, errors, steps
from durably.agents import approvals, budget, completions, usage
from durably.integrations import _common

__all__ = ["DurableAgent", "DurableModel", "DurableToolset"]

MODEL_STEP = usage.MODEL_STEP_PREFIX + "pydantic_ai"
#: The step of a request's token count before it is sent (not a model call: not "llm:").
COUNT_STEP = "count_tokens"
_GATED = "durably_requires_approval"  # set in a gated tool's metadata by DurableToolset
_RETRY = "durably_model_retry"  # a tool step's result standing for a ModelRetry it raised

JSON = dict[str, Any]


def _in_workflow_code() -> bool:
    return context.current_run.get() is not None and context.current_step.get() is None


def response_record(response: ModelResponse) -> JSON:
    """A model response as the journal keeps it: Pydantic AI's JSON, and usage."""
    [dumped] = ModelMessagesTypeAdapter.dump_python([response], mode="json")
    u = response.usage
    return {
        "response": dumped,
        "model": response.model_name or "",
        "usage": _common.usage_record(u.input_tokens, u.output_tokens, u.cache_read_tokens),
    }


def response_from(record: Mapping[str, Any], where: str) -> ModelResponse:
    """The ModelResponse of a journaled record; DecodeError naming ``where`` if it is not one."""
    try:
        [message] = ModelMessagesTypeAdapter.validate_python([record["response"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.DecodeError(f"{where}: not a Pydantic AI model response: {exc}") from exc
    if not isinstance(message, ModelResponse):
        raise errors.DecodeError(f"{where}: recorded a {message.kind}, not a model response")
    return message


class DurableModel(WrapperModel):
    """A Pydantic AI model whose requests, streamed or not, are durable steps.

    Outside a workflow's own code (in a step, or with no workflow) it is the
    wrapped model unchanged. ``retry`` defaults to
    :class:`~durably.agents.ModelRetry` (429/5xx retried with durable back-off,
    other 4xx final); ``price_table`` prices usage.
    """

    def __init__(
        self,
        wrapped: Model | str,
        *,
        retry: steps.Retry | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
    ) -> None:
        super().__init__(wrapped)
        self.retry = completions.ModelRetry() if retry is None else retry
        self.price_table = usage.DEFAULT_PRICES if price_table is None else price_table

    async def _journaled(self, ask: Any, messages: list[ModelMessage]) -> ModelResponse:
        record = await _common.model_turn(
            ask,
            name=MODEL_STEP,
            retry=self.retry,
            prices=self.price_table,
            model=self.model_name,
            request=messages,
        )
        return response_from(record, f"step {MODEL_STEP!r}")

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Make (or replay from the journal) one model request."""
        if not _in_workflow_code():
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

        async def request_step() -> JSON:
            response = await self.wrapped.request(
                messages, _with_key(model_settings), model_request_parameters
            )
            return response_record(response)

        return await self._journaled(request_step, messages)

    async def count_tokens(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> RequestUsage:
        """Count a request's tokens before it is sent (``UsageLimits(count_tokens_before_
        request=True)``) as the step ``count_tokens``: a replay reads the count, so it
        neither asks the provider again nor trips a limit the first run did not."""
        if not _in_workflow_code():
            return await self.wrapped.count_tokens(
                messages, model_settings, model_request_parameters
            )

        async def count_step() -> JSON:
            counted = await self.wrapped.count_tokens(
                messages, model_settings, model_request_parameters
            )
            return dataclasses.asdict(counted)

        record: JSON = await steps.run_step(count_step, name=COUNT_STEP)
        known = {f.name for f in dataclasses.fields(RequestUsage)}
        return RequestUsage(**{k: v for k, v in record.items() if k in known})

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """A streamed request: consumed inside the step, journaled whole.

        The step runs in a task while the caller iterates: the events of a
        request made now reach the caller as they arrive (live only); a turn
        served from the journal yields its recorded parts once, after the step.
        Either way the response the run continues with is the journaled one.
        """
        if not _in_workflow_code():
            async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as live:
                yield live
            return
        stream = _LiveStream(model_request_parameters)

        async def stream_step() -> JSON:
            async with self.wrapped.request_stream(
                messages, _with_key(model_settings), model_request_parameters, run_context
            ) as streamed:
                async for event in streamed:
                    stream.feed(event)
            return response_record(streamed.get())

        stream.step = asyncio.ensure_future(self._journaled(stream_step, messages))
        stream.step.add_done_callback(lambda _: stream.queue.put_nowait(_END))
        try:
            yield stream
        finally:
            if not stream.step.done():  # the caller stopped early: the step still ends
                await stream.step


_END = object()


class _LiveStream(CompletedStreamedResponse):
    """A streamed response whose events come from the model step while it runs.

    Built on ``CompletedStreamedResponse`` (which the graph accepts in place of
    a live stream): ``response`` is set to the journaled response when the step
    ends, so ``get()`` and ``usage`` are what the journal holds. Live events are
    the wrapped stream's own (its part ends and final-result events included),
    so they are passed on as they are; a replayed turn's events are
    synthesized from the journaled parts, as the SDK does for a completed
    response.
    """

    def __init__(self, model_request_parameters: ModelRequestParameters) -> None:
        super().__init__(ModelResponse(parts=[]), model_request_parameters=model_request_parameters)
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.step: asyncio.Future[ModelResponse] = asyncio.get_running_loop().create_future()
        self.fed = False

    def feed(self, event: ModelResponseStreamEvent) -> None:
        """Take one event of the live request (from the step's task)."""
        self.fed = True
        self.queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[ModelResponseStreamEvent]:
        if self._event_iterator is None:
            self._event_iterator = self._events()
        return self._event_iterator

    async def _events(self) -> AsyncIterator[ModelResponseStreamEvent]:
        while (item := await self.queue.get()) is not _END:
            yield cast(ModelResponseStreamEvent, item)
        response = await self.step  # the step's error, if any, is the caller's
        self.response = response
        self.state = response.state
        if not self.fed:
            replay = CompletedStreamedResponse(
                response, model_request_parameters=self.model_request_parameters, replay_events=True
            )
            async for event in replay:
                yield event
        self._finished = True


def _with_key(model_settings: ModelSettings | None) -> ModelSettings:
    """The settings with the step's idempotency key as a header, the same on every attempt."""
    settings = cast(ModelSettings, dict(model_settings or {}))
    headers = dict(settings.get("extra_headers") or {})
    headers.setdefault(completions.IDEMPOTENCY_HEADER, context.idempotency_key())
    settings["extra_headers"] = headers
    return settings


@dataclasses.dataclass
class DurableToolset(WrapperToolset[Any]):
    """A Pydantic AI toolset whose tool calls are durable steps named by tool and call id.

    A tool that requires approval is offered to the graph as an ordinary tool,
    and its call waits for durably's approval first (see the module docstring).
    """

    approval_timeout: float | None = None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The wrapped tools, gated ones marked so that this toolset asks for their approval."""
        tools = await self.wrapped.get_tools(ctx)
        if not _in_workflow_code():
            return tools
        out = {}
        for name, tool in tools.items():
            if tool.tool_def.kind == "unapproved":
                metadata = {**(tool.tool_def.metadata or {}), _GATED: True}
                tool_def = dataclasses.replace(tool.tool_def, kind="function", metadata=metadata)
                tool = dataclasses.replace(tool, tool_def=tool_def)
            out[name] = tool
        return out

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run (or replay) one tool call as the step ``tool:<name>:<tool call id>``."""
        if not _in_workflow_code():
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        call_id = ctx.tool_call_id or name
        if (tool.tool_def.metadata or {}).get(_GATED) and not ctx.tool_call_approved:
            shown = pydantic_core.to_jsonable_python(tool_args)
            request = approvals.Request(name, shown, call_id, self.approval_timeout, "reject")
            gates = approvals.open_gates([request])
            [decision] = await approvals.decide(gates)
            approvals.close_gates(gates)
            if not decision.approved:
                return decision.rejection()
            if decision.override_args is not None:  # validated as the model's arguments are
                tool_args = tool.args_validator.validate_python(decision.override_args)
            ctx = dataclasses.replace(ctx, tool_call_approved=True)

        async def tool_step() -> Any:
            try:
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
            except ModelRetry as exc:  # the model is asked again: journal it as an answer
                return {_RETRY: exc.message}
            except ApprovalRequired as exc:
                raise errors.DefinitionError(
                    f"tool {name!r} raised ApprovalRequired from its body; with durably, declare "
                    "it with requires_approval=True so the call parks before it runs"
                ) from exc

        result = await steps.run_step(tool_step, name=f"tool:{name}:{call_id}")
        if isinstance(result, dict) and set(result) == {_RETRY}:
            raise ModelRetry(str(result[_RETRY]))
        return result


_TOOL_DEFS: pydantic.TypeAdapter[dict[str, ToolDefinition]] = pydantic.TypeAdapter(
    dict[str, ToolDefinition]
)


@dataclasses.dataclass
class _MCPListing(WrapperToolset[Any]):
    """An ``MCPToolset`` whose tool listing is the step ``mcp:<toolset id>:list_tools``.

    The listing journals each tool's ``ToolDefinition`` (Pydantic AI's own
    dataclass, as JSON); on replay the tools are rebuilt from the journal with
    the toolset's public ``tool_for_tool_def`` and the server is not asked.
    Its tool calls are journaled by the :class:`DurableToolset` around it.
    """

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The server's tools, listed once per model turn as a step."""
        if not _in_workflow_code():
            return await self.wrapped.get_tools(ctx)
        mcp: Any = self.wrapped  # an MCPToolset (pydantic_ai.mcp needs the optional fastmcp)

        async def list_step() -> Any:
            tools = await self.wrapped.get_tools(ctx)
            return _TOOL_DEFS.dump_python({n: t.tool_def for n, t in tools.items()}, mode="json")

        step = f"mcp:{mcp.id or 'server'}:list_tools"
        listed = await steps.run_step(list_step, name=step)
        try:
            defs = _TOOL_DEFS.validate_python(listed)
        except (TypeError, ValueError) as exc:
            raise errors.DecodeError(
                f"step {step!r}: not Pydantic AI tool definitions: {exc}"
            ) from exc
        return {name: mcp.tool_for_tool_def(d, ctx=ctx) for name, d in defs.items()}


def _journal_mcp(toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
    """``toolset`` (a leaf) with its tool listing journaled when it is an MCP server's."""
    mcp = sys.modules.get("pydantic_ai.mcp")  # loaded by whoever made an MCPToolset
    if mcp is not None and isinstance(toolset, mcp.MCPToolset):
        return _MCPListing(toolset)
    return toolset


def _durable(toolset: AbstractToolset[Any], approval_timeout: float | None) -> DurableToolset:
    return DurableToolset(toolset.visit_and_replace(_journal_mcp), approval_timeout)


class DurableAgent:
    """A Pydantic AI agent whose run is durable inside a ``@durably.workflow``.

    ``(await DurableAgent(agent).run(prompt)).output``: every model request and
    tool call is a step, so after a crash the workflow re-runs and completed
    requests and tool calls come back from the journal. ``run`` takes the
    keyword arguments of ``Agent.run`` (``deps=``, ``message_history=``, ...).

    ``retry`` is the model requests' retry policy; ``price_table`` prices their
    usage; ``approval_timeout`` (seconds) bounds the wait for an approval, after
    which the call is rejected. ``max_cost`` (dollars, by ``price_table``) and
    ``max_tokens`` bound the model requests of the workflow run, counted from
    the journal: when reached the run parks for a person (see
    :mod:`durably.agents.budget`); ``run(max_cost=..., max_tokens=...)``
    replaces them for one run.
    """

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        retry: steps.Retry | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
        approval_timeout: float | None = None,
        max_cost: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.limits = budget.Limits(max_cost, max_tokens)
        if not isinstance(agent, Agent):
            raise errors.DefinitionError(
                f"DurableAgent wraps a pydantic_ai.Agent, got {type(agent).__name__}"
            )
        if agent.model is None:
            raise errors.DefinitionError(
                "DurableAgent needs an agent created with a model (Agent(model, ...)): its "
                "requests become steps when the agent is wrapped, not per run"
            )
        model = agent.model if isinstance(agent.model, Model) else str(agent.model)
        client = getattr(model, "client", None)  # OpenAI models: the retries would be invisible
        if client is not None:
            completions.warn_if_client_retries(client)
        self.wrapped = agent
        self.approval_timeout = approval_timeout
        self.model = DurableModel(model, retry=retry, price_table=price_table)
        self.toolsets: Sequence[AbstractToolset[Any]] = [
            _durable(toolset, approval_timeout) for toolset in agent.toolsets
        ]

    def __repr__(self) -> str:
        return f"<durably DurableAgent {self.wrapped.name or 'agent'}>"

    async def run(
        self,
        user_prompt: Any = None,
        *,
        max_cost: float | None = None,
        max_tokens: int | None = None,
        **options: Any,
    ) -> AgentRunResult[Any]:
        """Run the agent durably; the arguments are those of ``Agent.run``.

        ``max_cost`` / ``max_tokens`` replace the wrapper's budget for this run.

        Raises NotInWorkflow outside a workflow's own code: there the run
        could not be journaled, and a silent non-durable run is what wrapping
        is meant to prevent.
        """
        _common.require_workflow("DurableAgent.run()")
        if "model" in options:
            raise errors.DefinitionError(
                "DurableAgent.run(model=...) is not supported: give the model to the Agent "
                "before wrapping it, so that its requests are steps"
            )
        extra = [_durable(t, self.approval_timeout) for t in options.pop("toolsets", ())]
        with (
            self.wrapped.override(model=self.model, toolsets=[*self.toolsets, *extra], tools=[]),
            Agent.parallel_tool_call_execution_mode("sequential"),
            _common.budgeted(_common.limits(self.limits, max_cost, max_tokens)),
        ):
            return await self.wrapped.run(user_prompt, **options)
