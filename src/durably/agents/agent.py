"""The durable agent loop: every model turn and every tool call is a step.

``await agent.run(input)`` inside a workflow alternates model turns (the step
``llm:chat.completions``, journaling the response and its usage) and tool
calls (the steps ``tool:<name>:<tool_call_id>``), until the model answers
without calling a tool. After a crash the workflow re-runs from its first line
and this loop re-runs with it: each journaled turn and tool result comes back
from the journal and the message list is rebuilt from them, so the journal
never holds the growing conversation, only what each turn added.

Parallel tool calls take their seqs in the order the model listed them before
any of them runs, then run together; so they replay in the recorded order
whatever order they finished in. Approval-gated calls publish their approvals
and wait (the ungated calls of the same turn run meanwhile); a rejection or a
tool's :class:`ToolError` reaches the model as the tool's result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from durably import errors, steps, validate
from durably.agents import (
    approvals,
    budget,
    completions,
    events,
    exceptions,
    output,
    schema,
    usage,
)
from durably.agents import tools as agent_tools

JSON = dict[str, Any]
_SYSTEM = ("system", "developer")


@dataclasses.dataclass(frozen=True, slots=True)
class AgentResult:
    """What ``agent.run`` returns: the final text, the conversation, usage and turn count."""

    output: Any  # the text, or the validated value of the agent's output_type
    messages: list[JSON]
    usage: usage.Usage
    turns: int
    tool_calls: int = 0


@dataclasses.dataclass(slots=True)
class _Planned:
    """One tool call of a turn, checked before anything runs."""

    call_id: str
    tool: agent_tools.Tool[Any, Any] | None = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    shown: JSON = dataclasses.field(default_factory=dict)
    content: str | None = None  # decided without running the tool (an error for the model)
    gate: approvals.Gate | None = None
    running: Coroutine[Any, Any, Any] | None = None
    outcome: Any = None


class Agent:
    """A model with instructions and tools, run durably by ``await agent.run(input)``.

    ``client`` is an ``openai.AsyncOpenAI`` or ``openai.OpenAI`` (any
    OpenAI-compatible ``base_url``), or an ``anthropic.AsyncAnthropic`` /
    ``Anthropic`` (the Messages API, natively), created with ``max_retries=0``.
    ``max_turns`` bounds the model calls of one run; ``price_table`` prices
    usage (default: the EXAMPLE ``DEFAULT_PRICES``); ``model_settings`` are
    passed to every ``create`` call (temperature, tool_choice, ...); ``retry``
    and ``timeout`` are the model step's (default :class:`ModelRetry`);
    ``stream=True`` streams each turn inside its step (chat completions, or
    the Messages API's server-sent events) and journals the assembled
    completion. ``output_type`` (a pydantic model or any type
    pydantic validates) makes the final answer a validated value: the model is
    asked for JSON fitting its schema and, when an answer does not fit, told
    why and asked again at most ``output_retries`` times (see
    :mod:`durably.agents.output`). ``strict=True`` sends the tools' schemas
    strict where every parameter is required. ``max_cost`` (dollars, by
    ``price_table``) and ``max_tokens`` bound the model calls of the workflow
    run, counted from the journal: when reached the run parks for a person
    (see :mod:`durably.agents.budget`).
    """

    def __init__(
        self,
        *,
        client: Any,
        model: str,
        instructions: str | None = None,
        tools: Sequence[agent_tools.Tool[Any, Any] | Any] = (),
        max_turns: int = 25,
        price_table: Mapping[str, usage.Price] | None = None,
        model_settings: Mapping[str, Any] | None = None,
        retry: steps.Retry | None = None,
        timeout: float | None = None,
        stream: bool = False,
        idempotency_header: str | None = completions.IDEMPOTENCY_HEADER,
        name: str = "agent",
        output_type: Any = None,
        output_retries: int = 2,
        strict: bool = False,
        max_cost: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        validate.count(max_turns, "max_turns", error=errors.DefinitionError)
        validate.count(output_retries, "output_retries", low=0, error=errors.DefinitionError)
        completions.warn_if_client_retries(client)
        self.client = client
        self.model = model
        self.instructions = instructions
        self.name = name
        self.max_turns = max_turns
        self.price_table = usage.DEFAULT_PRICES if price_table is None else price_table
        self.model_settings = dict(model_settings or {})
        self.stream = stream
        self.tools: dict[str, agent_tools.Tool[Any, Any]] = {}
        for item in tools:
            made = item if isinstance(item, agent_tools.Tool) else agent_tools.tool(item)
            if made.name in self.tools:
                raise errors.DefinitionError(f"agent {name!r} has two tools named {made.name!r}")
            self.tools[made.name] = made
        self._definitions = [t.definition(strict=strict) for t in self.tools.values()]
        self.output = None if output_type is None else output.Output(output_type)
        self.output_retries = output_retries
        self.limits = budget.Limits(max_cost, max_tokens)
        self._step = completions.model_step(
            client,
            retry=completions.ModelRetry() if retry is None else retry,
            timeout=timeout,
            idempotency_header=idempotency_header,
        )

    def __repr__(self) -> str:
        return f"<durably Agent {self.name!r} model={self.model!r} tools={list(self.tools)}>"

    def initial_messages(self, input: str | Sequence[Mapping[str, Any]]) -> list[JSON]:
        """The conversation before the first turn: instructions, then the input.

        A list that already starts with a system (or developer) message, such as
        an earlier ``result.messages`` continued, keeps its own.
        """
        given = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        messages = [dict(m) for m in given]
        if self.instructions and not (messages and messages[0].get("role") in _SYSTEM):
            messages.insert(0, {"role": "system", "content": self.instructions})
        return messages

    async def run(
        self,
        input: str | Sequence[Mapping[str, Any]],
        *,
        max_turns: int | None = None,
        max_cost: float | None = None,
        max_tokens: int | None = None,
        on_event: events.EventCallback | None = None,
    ) -> AgentResult:
        """Run the conversation to the model's final answer (inside a workflow, durably).

        ``input`` is the user's message, or a list of chat messages to start
        from. Raises MaxTurnsExceeded after ``max_turns`` model calls.
        ``max_cost`` / ``max_tokens`` replace the agent's budget for this run.
        ``on_event`` gets text deltas and tool start/end events, live only (see
        :mod:`durably.agents.events`).
        """
        limits = self.limits
        if max_cost is not None or max_tokens is not None:
            limits = budget.Limits(
                limits.max_cost if max_cost is None else max_cost,
                limits.max_tokens if max_tokens is None else max_tokens,
            )
        messages = self.initial_messages(input)
        meter = usage.Meter()
        token = usage.agent_meter.set(meter)  # sub-agents' usage rolls up into it
        try:
            return await self._loop(messages, meter, limits, max_turns, on_event)
        finally:
            usage.agent_meter.reset(token)

    async def _loop(
        self,
        messages: list[JSON],
        meter: usage.Meter,
        limits: budget.Limits,
        max_turns: int | None,
        on_event: events.EventCallback | None,
    ) -> AgentResult:
        limit = self.max_turns if max_turns is None else max_turns
        calls_made = 0
        corrections = 0
        turn = 0

        def on_text(piece: str, replayed: bool) -> None:
            events.emit(on_event, events.AgentEvent("text", piece, replayed=replayed, turn=turn))

        for turn in range(1, limit + 1):
            params: JSON = {"model": self.model, "messages": list(messages), **self.model_settings}
            if self._definitions:
                params["tools"] = self._definitions
            if self.output is not None:
                params.setdefault("response_format", self.output.response_format())
            if self.stream:
                params["stream"] = True
            replayed_before = meter.replayed.calls
            response = await completions.call_model(
                self._step,
                params,
                self.price_table,
                meter,
                limits=limits,
                on_text=on_text if on_event is not None else None,
            )
            replayed = meter.replayed.calls > replayed_before
            message = assistant_message(completions.first_message(response))
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                if self.output is None:
                    text = message.get("content") or ""
                    return AgentResult(text, messages, meter.usage(), turn, calls_made)
                try:
                    value = self.output.validate(message.get("content"))
                except ValueError as exc:
                    corrections += 1
                    if corrections > self.output_retries:
                        raise self.output.exhausted(corrections, str(exc)) from None
                    messages.append(self.output.correction(str(exc)))
                    continue
                step = self.output.accepted
                value = await steps.run_step(step, value, name=f"output:{self.name}")
                return AgentResult(value, messages, meter.usage(), turn, calls_made)
            calls_made += len(calls)
            names = {str(c.get("id") or ""): _tool_event(c, replayed, turn) for c in calls}
            for started in names.values():
                events.emit(on_event, started)
            for call_id, content in await self.run_tools(calls):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
                started = names[call_id]
                ended = dataclasses.replace(started, kind="tool_end", result=content)
                events.emit(on_event, ended)
        raise exceptions.MaxTurnsExceeded(
            f"agent {self.name!r} made {limit} model calls without a final answer"
        )

    # --- tools -------------------------------------------------------------------------

    def plan(self, call: Mapping[str, Any]) -> _Planned:
        """Check one tool call of the model: known tool, JSON arguments that fit its schema."""
        function = call.get("function") or {}
        planned = _Planned(str(call.get("id") or ""))
        name = str(function.get("name") or "")
        found = self.tools.get(name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            planned.content = agent_tools.error_text(f"unknown tool {name!r} (tools: {known})")
            return planned
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            planned.kwargs, planned.shown = found.signature.validate(arguments)
        except (ValueError, schema.InvalidArguments) as exc:
            planned.content = agent_tools.error_text(f"{name}: {exc}")
            return planned
        planned.tool = found
        return planned

    async def run_tools(self, calls: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
        """Run one turn's tool calls; (tool_call_id, content) for each, in the model's order.

        Seqs are taken in the model's order before anything runs: first the
        ungated calls and the approvals of the gated ones, then (after the
        decisions) the approved calls.
        """
        planned = [self.plan(call) for call in calls]
        requests: list[approvals.Request] = []
        gated: list[_Planned] = []
        for p in planned:
            if p.tool is None:
                continue
            if p.tool.gated(p.shown):
                requests.append(p.tool.approval_request(p.shown, p.call_id))
                gated.append(p)
            else:
                p.running = p.tool.call_for_model(p.call_id, p.kwargs)
        gates = approvals.open_gates(requests)
        for p, gate in zip(gated, gates, strict=True):
            p.gate = gate
        first = [p for p in planned if p.running is not None]
        await _settle(first, approvals.decide(gates))
        approved = [p for p in gated if self._after_decision(p)]
        await _settle(approved)
        approvals.close_gates(gates)
        return [(p.call_id, _content(p)) for p in planned]

    def _after_decision(self, p: _Planned) -> bool:
        """Start the approved call (True), or settle the tool message for a rejected one."""
        assert p.gate is not None and p.gate.decision is not None and p.tool is not None
        decision = p.gate.decision
        if not decision.approved:
            p.content = agent_tools.error_text(decision.rejection())
            return False
        kwargs = p.kwargs
        if decision.override_args is not None:
            try:
                kwargs, _ = p.tool.signature.validate(decision.override_args)
            except schema.InvalidArguments as exc:
                text = f"approved by {decision.by} with arguments that do not fit: {exc}"
                p.content = agent_tools.error_text(text)
                return False
        p.running = p.tool.call_for_model(p.call_id, kwargs)
        return True


def _tool_event(call: Mapping[str, Any], replayed: bool, turn: int) -> events.AgentEvent:
    """The ``tool_start`` event of one tool call of the model."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = None
    return events.AgentEvent(
        "tool_start",
        tool=str(function.get("name") or ""),
        call_id=str(call.get("id") or ""),
        arguments=arguments if isinstance(arguments, dict) else None,
        replayed=replayed,
        turn=turn,
    )


#: What stops the run itself rather than failing one tool call: raised at once.
_CONTROL = (errors.NonDeterminismError, errors.FencedError, errors.Cancelled, errors.StoreError)


async def _settle(planned: Sequence[_Planned], *also: Coroutine[Any, Any, Any]) -> None:
    """Await the running calls (and ``also``) together, keeping each call's outcome.

    Every branch is let finish before anything is raised, so no wait or step is
    left behind; then a cancellation, divergence, lost lease or suspension is
    raised before the turn takes another seq. A tool's own exception stays its
    outcome (see ``_content``).
    """
    running = [p.running for p in planned if p.running is not None]
    outcomes = await asyncio.gather(*running, *also, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and (
            not isinstance(outcome, Exception) or isinstance(outcome, _CONTROL)
        ):
            raise outcome
    for p, outcome in zip(planned, outcomes, strict=False):
        p.outcome = outcome
    for outcome in outcomes[len(running) :]:
        if isinstance(outcome, BaseException):
            raise outcome


def _content(p: _Planned) -> str:
    """The tool message for one call; re-raises a tool's unexpected exception."""
    if p.content is not None:
        return p.content
    outcome = p.outcome
    if isinstance(outcome, exceptions.ToolError):
        return agent_tools.error_text(str(outcome))
    if isinstance(outcome, BaseException):
        raise outcome
    decision = p.gate.decision if p.gate is not None else None
    if decision is not None and decision.override_args is not None:
        note = {
            "result": schema.to_json(outcome),
            "note": f"{decision.by} approved this call with changed arguments",
            "arguments_used": decision.override_args,
        }
        return json.dumps(note, ensure_ascii=False, default=str)
    return agent_tools.result_text(outcome)


def assistant_message(message: Mapping[str, Any]) -> JSON:
    """The assistant message to send back in the next request (only the fields that matter)."""
    out: JSON = {"role": "assistant", "content": message.get("content")}
    if message.get("refusal"):
        out["refusal"] = message["refusal"]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type") or "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments") or "{}",
                },
            }
            for c in calls
        ]
    return out
