"""OpenAI Agents SDK runs made durable by wrapping: ``DurableRunner.run(agent, input)``.

Inside a ``@durably.workflow``, in place of the SDK's ``Runner.run``::

    result = await DurableRunner.run(agent, "Where is my order?")
    return result.final_output

Built on the SDK's public extension points, not on its internals:

- :class:`DurableModel` (a ``Model``) and :class:`DurableModelProvider` (a
  ``ModelProvider``): every model call is the step ``llm:openai_agents``,
  whatever the model (the Responses API model, the SDK's default, or the chat
  completions model; a name resolved by the run's provider or a ``Model`` set
  on an agent). The journal keeps the response's output items as the OpenAI
  API's JSON (``model_dump``), its usage, and its ids; on replay the SDK gets
  the same ``ModelResponse`` back and the provider is not asked.
- Function tools: each agent reachable from the starting agent (through its
  handoffs) is cloned with its ``FunctionTool`` s wrapped, so each call is the
  step ``tool:<tool name>:<call id>``. A tool with ``needs_approval`` parks the
  workflow on durably's approvals instead of interrupting the run; a
  rejection reaches the model as the tool's output.

Handoffs are function calls in a model response, so they replay in the
recorded order with it; a handoff built by ``agents.handoff()`` is invoked as
the step ``handoff:<tool name>``, so its ``on_handoff`` callback runs once.
An agent with ``mcp_servers`` is refused (DefinitionError): MCP tool listings
and calls are not journaled here. Function tools run one at a time
(``max_function_tool_concurrency=1``) so their steps take their seqs in the
model's order on every replay. Usage feeds the run's billed/replayed meter.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pydantic
from agents import (
    Agent,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    RunResult,
)
from agents.items import TResponseOutputItem
from agents.run_config import ToolExecutionConfig
from agents.tool_context import ToolContext
from agents.usage import Usage

from durably import context, errors, steps
from durably.agents import approvals, budget, completions, usage
from durably.integrations import _common

__all__ = ["DurableModel", "DurableModelProvider", "DurableRunner"]

MODEL_STEP = usage.MODEL_STEP_PREFIX + "openai_agents"
JSON = dict[str, Any]

_OUTPUT: pydantic.TypeAdapter[list[TResponseOutputItem]] = pydantic.TypeAdapter(
    list[TResponseOutputItem]
)
_USAGE: pydantic.TypeAdapter[Usage] = pydantic.TypeAdapter(Usage)


def _in_workflow_code() -> bool:
    return context.current_run.get() is not None and context.current_step.get() is None


def response_record(response: ModelResponse, model: str) -> JSON:
    """A model response as the journal keeps it: the API's JSON of each item, usage, ids."""
    u = response.usage
    return {
        "response": {
            "output": _OUTPUT.dump_python(response.output, mode="json"),
            "usage": _USAGE.dump_python(u, mode="json"),
            "response_id": response.response_id,
            "request_id": response.request_id,
        },
        "model": model,
        "usage": _common.usage_record(
            u.input_tokens, u.output_tokens, u.input_tokens_details.cached_tokens or 0
        ),
    }


def response_from(record: Mapping[str, Any], where: str) -> ModelResponse:
    """The ModelResponse of a journaled record; DecodeError naming ``where`` if it is not one."""
    try:
        data = record["response"]
        return ModelResponse(
            output=_OUTPUT.validate_python(data["output"]),
            usage=_USAGE.validate_python(data["usage"]),
            response_id=data.get("response_id"),
            request_id=data.get("request_id"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.DecodeError(f"{where}: not an Agents SDK model response: {exc}") from exc


class DurableModel(Model):
    """An Agents SDK model whose calls are durable steps (outside a workflow: the model itself).

    ``retry`` defaults to :class:`~durably.agents.ModelRetry`; ``price_table``
    prices usage by the wrapped model's name.
    """

    def __init__(
        self,
        wrapped: Model,
        *,
        retry: steps.Retry | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
    ) -> None:
        self.wrapped = wrapped
        self.retry = completions.ModelRetry() if retry is None else retry
        self.price_table = usage.DEFAULT_PRICES if price_table is None else price_table

    def __repr__(self) -> str:
        return f"<durably DurableModel {self.wrapped!r}>"

    @property
    def model_name(self) -> str:
        """The wrapped model's name (what usage is priced by), or ``""``."""
        name = getattr(self.wrapped, "model", "")
        return name if isinstance(name, str) else ""

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        """Make (or replay from the journal) one model call."""

        def call(settings: ModelSettings) -> Awaitable[ModelResponse]:
            return self.wrapped.get_response(
                system_instructions,
                input,
                settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )

        if not _in_workflow_code():
            return await call(model_settings)

        async def model_step() -> JSON:
            headers = dict(model_settings.extra_headers or {})
            headers.setdefault(completions.IDEMPOTENCY_HEADER, context.idempotency_key())
            response = await call(dataclasses.replace(model_settings, extra_headers=headers))
            return response_record(response, self.model_name)

        record = await _common.model_turn(
            model_step,
            name=MODEL_STEP,
            retry=self.retry,
            prices=self.price_table,
            model=self.model_name,
            request=input,
        )
        return response_from(record, f"step {MODEL_STEP!r}")

    def stream_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[Any]:
        """The wrapped model's stream outside a workflow; refused inside one (not journaled)."""
        if _in_workflow_code():
            raise errors.DefinitionError(
                "a streamed Agents SDK run (Runner.run_streamed) is not durable; use "
                "DurableRunner.run(agent, input) inside the workflow"
            )
        return self.wrapped.stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    async def close(self) -> None:
        """Close the wrapped model."""
        await self.wrapped.close()


class DurableModelProvider(ModelProvider):
    """A ModelProvider whose models are :class:`DurableModel` s over the wrapped provider's."""

    def __init__(
        self,
        wrapped: ModelProvider,
        *,
        retry: steps.Retry | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
    ) -> None:
        self.wrapped = wrapped
        self.retry = retry
        self.price_table = price_table

    def get_model(self, model_name: str | None) -> Model:
        """The wrapped provider's model for ``model_name``, its calls made durable."""
        return self.wrap(self.wrapped.get_model(model_name))

    def wrap(self, model: Model) -> Model:
        """``model`` as a DurableModel (unchanged if it already is one)."""
        if isinstance(model, DurableModel):
            return model
        return DurableModel(model, retry=self.retry, price_table=self.price_table)

    async def aclose(self) -> None:
        """Close the wrapped provider."""
        await self.wrapped.aclose()


ApprovalCheck = Callable[[Any, dict[str, Any], str], Awaitable[bool]]


def durable_tool(tool: FunctionTool, approval_timeout: float | None = None) -> FunctionTool:
    """``tool`` with each call a step ``tool:<name>:<call id>``, approvals on durably's gates."""
    invoke = tool.on_invoke_tool
    needs: bool | ApprovalCheck = tool.needs_approval
    name = tool.name

    async def on_invoke_tool(ctx: ToolContext[Any], input_json: str) -> Any:
        if not _in_workflow_code():
            return await invoke(ctx, input_json)
        call_id = ctx.tool_call_id
        if needs is not False:
            arguments = json.loads(input_json or "{}")
            gated = needs if isinstance(needs, bool) else await needs(ctx, arguments, call_id)
            if gated:
                request = approvals.Request(name, arguments, call_id, approval_timeout, "reject")
                gates = approvals.open_gates([request])
                [decision] = await approvals.decide(gates)
                approvals.close_gates(gates)
                if not decision.approved:
                    return decision.rejection()
                if decision.override_args is not None:
                    input_json = json.dumps(decision.override_args)

        async def tool_step() -> Any:
            return await invoke(ctx, input_json)

        return await steps.run_step(tool_step, name=f"tool:{name}:{call_id}")

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=False)


class _Wrapper:
    """Durable clones of an agent graph (handoffs followed, cycles kept), made per run."""

    def __init__(self, provider: DurableModelProvider, approval_timeout: float | None) -> None:
        self.provider = provider
        self.approval_timeout = approval_timeout
        self.clones: dict[int, Agent[Any]] = {}

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        done = self.clones.get(id(agent))
        if done is not None:
            return done
        if agent.mcp_servers:  # their tools are listed and called outside any step
            names = ", ".join(repr(getattr(s, "name", "?")) for s in agent.mcp_servers)
            raise errors.DefinitionError(
                f"agent {agent.name!r} uses MCP server {names}: DurableRunner does not journal "
                "MCP tool listings or calls, so they would run again on every replay. Wrap "
                "each MCP tool you need as a function_tool (its call is then a step), or run "
                "this agent with Runner.run outside a workflow"
            )
        model = self.provider.wrap(agent.model) if isinstance(agent.model, Model) else agent.model
        tools = [
            durable_tool(t, self.approval_timeout) if isinstance(t, FunctionTool) else t
            for t in agent.tools
        ]
        clone = agent.clone(model=model, tools=tools)
        self.clones[id(agent)] = clone
        clone.handoffs = [
            self.agent(h) if isinstance(h, Agent) else self.handoff(h) for h in agent.handoffs
        ]
        return clone

    def handoff(self, handoff: Handoff[Any, Any]) -> Handoff[Any, Any]:
        """``handoff`` whose invocation (its ``on_handoff`` callback) is the step
        ``handoff:<tool name>``, journaling the target agent's name.

        On replay the callback does not run again: the target is the agent
        ``agents.handoff(agent)`` was built with (the SDK keeps it, weakly, in
        ``Handoff._agent_ref``), checked against the journaled name. A Handoff
        built by hand has no such reference: its ``on_invoke_handoff`` is
        called again on replay (documented in docs/agents.md).
        """
        invoke = handoff.on_invoke_handoff
        reference = getattr(handoff, "_agent_ref", None)
        target_of = reference if callable(reference) else None

        async def on_invoke_handoff(ctx: Any, input_json: str) -> Any:
            known = target_of() if target_of is not None else None
            if not _in_workflow_code() or not isinstance(known, Agent):
                target = await invoke(ctx, input_json)
                return self.agent(target) if isinstance(target, Agent) else target

            async def handoff_step() -> str:
                target = await invoke(ctx, input_json)
                return str(getattr(target, "name", ""))

            step = f"handoff:{handoff.tool_name}"
            name: str = await steps.run_step(handoff_step, name=step)
            if name != known.name:
                raise errors.DecodeError(
                    f"step {step!r}: the journal recorded a handoff to agent {name!r}, but the "
                    f"handoff now targets {known.name!r}"
                )
            return self.agent(known)

        return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)


class DurableRunner:
    """``Runner.run`` made durable: ``(await DurableRunner.run(agent, input)).final_output``.

    Call it inside a ``@durably.workflow``'s own code; outside one it raises
    NotInWorkflow, since nothing could be journaled there.
    """

    @classmethod
    async def run(
        cls,
        starting_agent: Agent[Any],
        input: Any,
        *,
        run_config: RunConfig | Mapping[str, Any] | None = None,
        retry: steps.Retry | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
        approval_timeout: float | None = None,
        max_cost: float | None = None,
        max_tokens: int | None = None,
        **options: Any,
    ) -> RunResult:
        """Run ``starting_agent`` on ``input`` like ``Runner.run``, every model call and
        function tool call a step.

        ``options`` are ``Runner.run``'s (``context=``, ``max_turns=``, ``hooks=``,
        ...). ``retry`` is the model calls' retry policy, ``price_table`` prices
        their usage, ``approval_timeout`` (seconds) bounds the wait for an
        approval, after which the call is rejected. ``max_cost`` (dollars, by
        ``price_table``) and ``max_tokens`` bound the run's model calls,
        counted from the journal: when reached the run parks for a person
        (see :mod:`durably.agents.budget`).
        """
        run_limits = budget.Limits(max_cost, max_tokens)
        _common.require_workflow("DurableRunner.run()")
        if not isinstance(starting_agent, Agent):
            raise errors.DefinitionError(
                f"DurableRunner.run takes an agents.Agent, got {type(starting_agent).__name__}"
            )
        if run_config is None or isinstance(run_config, Mapping):
            config = RunConfig(**(run_config or {}))
        else:
            config = run_config
        provider = DurableModelProvider(config.model_provider, retry=retry, price_table=price_table)
        model = provider.wrap(config.model) if isinstance(config.model, Model) else config.model
        tool_execution = dataclasses.replace(
            config.tool_execution or ToolExecutionConfig(), max_function_tool_concurrency=1
        )
        durable_config = dataclasses.replace(
            config, model_provider=provider, model=model, tool_execution=tool_execution
        )
        agent = _Wrapper(provider, approval_timeout).agent(starting_agent)
        with _common.budgeted(run_limits):
            return await Runner.run(agent, input, run_config=durable_config, **options)
