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

- MCP servers (``mcp_servers``): each server's tool listing is the step
  ``mcp:<server name>:list_tools`` and its tools' calls are wrapped like
  function tools (see :mod:`durably.integrations._agents_sdk_mcp`).
- Guardrails (the agents' and the run config's, input and output): each run is
  a step (see :mod:`durably.integrations._agents_sdk_guardrails`).
- ``session=``: each of the session's reads and writes is a step (see
  :mod:`durably.integrations._agents_sdk_session`).
- ``DurableRunner.run_streamed``: each streamed model call is still one step,
  its events delivered live (see :mod:`durably.integrations._agents_sdk_stream`).

Handoffs are function calls in a model response, so they replay in the
recorded order with it; every handoff (``agents.handoff()`` or a ``Handoff``
built by hand) is invoked as the step ``handoff:<tool name>``, so its
callback runs once and a replay hands off to the agent of the journaled name.
Function tools run one at a time
(``max_function_tool_concurrency=1``) so their steps take their seqs in the
model's order on every replay. Usage feeds the run's billed/replayed meter.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
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
    RunResultStreaming,
)
from agents.items import TResponseOutputItem
from agents.run_config import ToolExecutionConfig
from agents.tool_context import ToolContext
from agents.usage import Usage

from durably import context, errors, steps
from durably.agents import approvals, budget, completions, usage
from durably.integrations import (
    _agents_sdk_guardrails,
    _agents_sdk_mcp,
    _agents_sdk_session,
    _agents_sdk_stream,
    _common,
)

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
            response = await call(_agents_sdk_stream.with_key(model_settings))
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
        """Stream (or replay from the journal) one model call (``Runner.run_streamed``).

        The stream is consumed inside the model step, which journals the
        response of its ``response.completed`` event as :meth:`get_response`
        journals one; the step runs in a task while the SDK iterates, so the
        events of a call made now reach it live. A call served from the journal
        yields one ``response.completed`` event of the recorded response,
        marked ``metadata["durably"] == "replayed"``.
        """

        def open_stream(settings: ModelSettings) -> AsyncIterator[Any]:
            return self.wrapped.stream_response(
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
            return open_stream(model_settings)

        async def turn(ask: Callable[[], Awaitable[JSON]]) -> JSON:
            return await _common.model_turn(
                ask,
                name=MODEL_STEP,
                retry=self.retry,
                prices=self.price_table,
                model=self.model_name,
                request=input,
            )

        def replayed(record: JSON) -> Any:
            recorded = response_from(record, f"step {MODEL_STEP!r}")
            return _agents_sdk_stream.replayed_event(recorded, self.model_name)

        return _agents_sdk_stream.journaled(
            lambda: open_stream(_agents_sdk_stream.with_key(model_settings)),
            turn,
            lambda response: response_record(response, self.model_name),
            replayed,
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

    def __init__(
        self,
        provider: DurableModelProvider,
        approval_timeout: float | None,
        handoff_agents: Sequence[Agent[Any]] = (),
    ) -> None:
        self.provider = provider
        self.approval_timeout = approval_timeout
        self.clones: dict[int, Agent[Any]] = {}
        self.named: dict[str, list[Agent[Any]]] = {}  # every agent seen, by name
        self.hand_built: list[Handoff[Any, Any]] = []
        for agent in handoff_agents:
            self.agent(agent)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        done = self.clones.get(id(agent))
        if done is not None:
            return done
        model = self.provider.wrap(agent.model) if isinstance(agent.model, Model) else agent.model
        tools = [
            durable_tool(t, self.approval_timeout) if isinstance(t, FunctionTool) else t
            for t in agent.tools
        ]
        servers = [_agents_sdk_mcp.durable_server(server) for server in agent.mcp_servers]
        clone = agent.clone(
            model=model,
            tools=tools,
            mcp_servers=servers,
            input_guardrails=[_agents_sdk_guardrails.durable(g) for g in agent.input_guardrails],
            output_guardrails=[_agents_sdk_guardrails.durable(g) for g in agent.output_guardrails],
        )
        if servers:
            # the SDK builds an MCP server's FunctionTools on every turn: wrap them as they come
            clone.get_mcp_tools = self._mcp_tools(clone)  # type: ignore[method-assign,assignment]
        self.clones[id(agent)] = clone
        self.named.setdefault(agent.name, []).append(agent)
        clone.handoffs = [
            self.agent(h) if isinstance(h, Agent) else self.handoff(h) for h in agent.handoffs
        ]
        return clone

    def _mcp_tools(self, clone: Agent[Any]) -> Callable[[Any], Awaitable[list[Any]]]:
        """``clone.get_mcp_tools`` with each MCP tool's calls made steps (``durable_tool``)."""
        listed = type(clone).get_mcp_tools.__get__(clone)

        async def get_mcp_tools(run_context: Any) -> list[Any]:
            tools = await listed(run_context)
            return [
                durable_tool(t, self.approval_timeout) if isinstance(t, FunctionTool) else t
                for t in tools
            ]

        return get_mcp_tools

    def target(self, name: str, where: str) -> Agent[Any]:
        """The one agent of the graph (or of ``handoff_agents``) named ``name``."""
        found = {id(a): a for a in self.named.get(name, ())}
        if len(found) != 1:
            known = ", ".join(sorted(self.named)) or "none"
            problem = "no agent" if not found else f"{len(found)} agents"
            raise errors.DefinitionError(
                f"{where}: {problem} named {name!r} among the agents DurableRunner knows "
                f"({known}); pass the agent a hand-built Handoff returns in "
                "DurableRunner.run(..., handoff_agents=[...]), under a name no other agent has"
            )
        return next(iter(found.values()))

    def check_handoffs(self) -> None:
        """Refuse, before the run, a hand-built Handoff whose target could not be replayed."""
        for handoff in self.hand_built:
            self.target(handoff.agent_name, f"handoff {handoff.tool_name!r}")

    def handoff(self, handoff: Handoff[Any, Any]) -> Handoff[Any, Any]:
        """``handoff`` whose invocation (its ``on_handoff`` callback, or a hand-built
        Handoff's ``on_invoke_handoff``) is the step ``handoff:<tool name>``,
        journaling the target agent's name.

        On replay the invocation does not run again: the target is the agent of
        that name. For ``agents.handoff(agent)`` that is the agent it was built
        with (the SDK keeps it, weakly, in ``Handoff._agent_ref``), checked
        against the journaled name; a Handoff built by hand names its target
        only by ``agent_name``, so that agent must be one DurableRunner knows:
        reachable through the starting agent's handoffs, or given in
        ``handoff_agents=`` (checked before the run starts).
        """
        invoke = handoff.on_invoke_handoff
        reference = getattr(handoff, "_agent_ref", None)
        built = reference() if callable(reference) else None
        if isinstance(built, Agent):
            self.agent(built)  # known by name, like the rest of the graph
        else:
            self.hand_built.append(handoff)
        step = f"handoff:{handoff.tool_name}"

        async def on_invoke_handoff(ctx: Any, input_json: str) -> Any:
            if not _in_workflow_code():
                target = await invoke(ctx, input_json)
                return self.agent(target) if isinstance(target, Agent) else target
            live: list[Any] = []

            async def handoff_step() -> str:
                target = await invoke(ctx, input_json)
                live.append(target)
                return str(getattr(target, "name", ""))

            name: str = await steps.run_step(handoff_step, name=step)
            if live and isinstance(live[0], Agent):  # invoked now: the agent it returned
                return self.agent(live[0])
            known = reference() if callable(reference) else None
            if isinstance(known, Agent):
                if name != known.name:
                    raise errors.DecodeError(
                        f"step {step!r}: the journal recorded a handoff to agent {name!r}, "
                        f"but the handoff now targets {known.name!r}"
                    )
                return self.agent(known)
            return self.agent(self.target(name, f"step {step!r}"))

        return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)


class DurableRunner:
    """``Runner.run`` made durable: ``(await DurableRunner.run(agent, input)).final_output``.

    Call it inside a ``@durably.workflow``'s own code; outside one it raises
    NotInWorkflow, since nothing could be journaled there.
    ``DurableRunner.run_streamed`` is ``Runner.run_streamed`` made durable.
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
        handoff_agents: Sequence[Agent[Any]] = (),
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
        (see :mod:`durably.agents.budget`). ``handoff_agents`` are the agents a
        hand-built ``Handoff`` may return that are not reachable through the
        starting agent's handoffs (found by name on replay).
        """
        _common.require_workflow("DurableRunner.run()")
        agent, config = _prepare(
            starting_agent, run_config, retry, price_table, approval_timeout, handoff_agents
        )
        options = _durable_options(options)
        with _common.budgeted(budget.Limits(max_cost, max_tokens)):
            return await Runner.run(agent, input, run_config=config, **options)

    @classmethod
    def run_streamed(
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
        handoff_agents: Sequence[Agent[Any]] = (),
        **options: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` made durable: iterate ``result.stream_events()`` in the
        workflow, then read ``result.final_output``.

        Takes the arguments of :meth:`run`. Each model call is still one step
        whose events reach ``stream_events()`` while it runs (live only); a
        call served from the journal yields one ``response.completed`` event
        with the whole recorded response, its ``metadata["durably"]`` set to
        ``"replayed"``, and the SDK's run item events follow as for a live one.
        """
        _common.require_workflow("DurableRunner.run_streamed()")
        agent, config = _prepare(
            starting_agent, run_config, retry, price_table, approval_timeout, handoff_agents
        )
        options = _durable_options(options)
        # the run's task is created inside run_streamed and keeps the budget set here
        with _common.budgeted(budget.Limits(max_cost, max_tokens)):
            return Runner.run_streamed(agent, input, run_config=config, **options)


def _durable_options(options: dict[str, Any]) -> dict[str, Any]:
    """``Runner.run``'s options, a ``session`` made durable (every read and write a
    step: a replay reads the history the first run read, and adds nothing again)."""
    if options.get("session") is None:
        return options
    return {**options, "session": _agents_sdk_session.durable(options["session"])}


def _prepare(
    starting_agent: Agent[Any],
    run_config: RunConfig | Mapping[str, Any] | None,
    retry: steps.Retry | None,
    price_table: Mapping[str, usage.Price] | None,
    approval_timeout: float | None,
    handoff_agents: Sequence[Agent[Any]],
) -> tuple[Agent[Any], RunConfig]:
    """The durable clone of the agent graph and the run config with durable models."""
    if not isinstance(starting_agent, Agent):
        raise errors.DefinitionError(
            f"DurableRunner takes an agents.Agent, got {type(starting_agent).__name__}"
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
        config,
        model_provider=provider,
        model=model,
        tool_execution=tool_execution,
        input_guardrails=[_agents_sdk_guardrails.durable(g) for g in config.input_guardrails or ()],
        output_guardrails=[
            _agents_sdk_guardrails.durable(g) for g in config.output_guardrails or ()
        ],
    )
    wrapper = _Wrapper(provider, approval_timeout, handoff_agents)
    agent = wrapper.agent(starting_agent)
    wrapper.check_handoffs()
    return agent, durable_config
