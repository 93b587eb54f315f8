"""``@durably.tool``: a durable step that a model can call.

A tool is a step (its result is journaled, its retries and timeout are the
step's) plus what the model needs to call it: a name, a description and a JSON
schema read from the function's hints and docstring (see
:mod:`durably.agents.schema`). It can require a person's approval, always or
when a predicate over the call's arguments says so.

Called directly inside a workflow (``await refund("A1", 500)``) a tool is the
step ``tool:<name>``; called by an :class:`~durably.agents.Agent`, each call is
the step ``tool:<name>:<tool_call_id>``, so the journal names every call by the
model's id and a replay that asks for another call there stops with
NonDeterminismError.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from durably import context, errors, steps, validate
from durably.agents import approvals, exceptions, schema

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
Approval = bool | Callable[[dict[str, Any]], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolOptions:
    """How a tool is exposed and gated, and the options of its step."""

    name: str | None = None
    description: str | None = None
    requires_approval: Approval = False
    approval_timeout: float | None = None
    on_approval_timeout: approvals.OnTimeout = "reject"
    retry: steps.Retry | None = None
    timeout: float | None = None
    step_options: dict[str, Any] = dataclasses.field(default_factory=dict)


class Tool(Generic[P, R]):
    """A decorated tool: call it (and await the call) like the function, or give it to an Agent."""

    def __init__(self, fn: Callable[..., Any], options: ToolOptions) -> None:
        if isinstance(fn, Tool | steps.StepFunction):
            raise errors.DefinitionError(f"{fn!r} is already a step; decorate the function itself")
        name: str = options.name or str(getattr(fn, "__name__", ""))
        if not _NAME.match(name):
            raise errors.DefinitionError(
                f"tool name {name!r}: use 1-64 letters, digits, '_' or '-' (the API's rule)"
            )
        gate = options.requires_approval
        if not isinstance(gate, bool) and not callable(gate):
            raise errors.DefinitionError(
                f"tool {name!r}: requires_approval= takes True/False or a predicate over the "
                f"arguments, got {type(gate).__name__}"
            )
        if options.on_approval_timeout not in ("reject", "approve"):
            raise errors.DefinitionError(
                f"tool {name!r}: on_approval_timeout must be 'reject' or 'approve'"
            )
        self.fn = fn
        self.name = name
        self.options = options
        self.signature = schema.signature(fn, name=name, description=options.description)
        self.step: steps.StepFunction[P, R] = self._step(f"tool:{name}")
        self._for_model = _as_seen_by_model(fn)
        functools.update_wrapper(self, fn)

    @property
    def description(self) -> str:
        """What the model reads about the tool."""
        return self.signature.description

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the tool's arguments."""
        return self.signature.parameters

    def definition(self, *, strict: bool = False) -> dict[str, Any]:
        """The tool as an entry of a chat completions ``tools`` list (strict: see Signature)."""
        return self.signature.definition(strict=strict)

    def __repr__(self) -> str:
        return f"<durably tool {self.name!r}>"

    def _step(self, step_name: str, fn: Callable[..., Any] | None = None) -> Any:
        opts = self.options
        make = steps.step(
            name=step_name, retry=_answers(opts.retry), timeout=opts.timeout, **opts.step_options
        )
        return make(fn or self.fn)

    def gated(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with these (JSON) arguments waits for a person's approval.

        The predicate runs again on every replay, so it must depend on the
        arguments only.
        """
        gate = self.options.requires_approval
        return bool(gate(arguments)) if callable(gate) else gate

    def approval_request(self, arguments: dict[str, Any], call_id: str | None) -> approvals.Request:
        """What to publish for a gated call of this tool."""
        opts = self.options
        return approvals.Request(
            self.name, arguments, call_id, opts.approval_timeout, opts.on_approval_timeout
        )

    def call_for_model(self, call_id: str, kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
        """Run the tool for the model's call ``call_id`` as step ``tool:<name>:<call_id>``.

        The seq is taken now. The step journals the JSON of the result as the model
        reads it (see ``result_text``), not the tool's value: the model only ever
        saw that text, and a replay then needs none of the result's classes (a
        later deploy may rename or change them).
        """
        step: steps.StepFunction[..., Any] = self._step(
            f"tool:{self.name}:{call_id}", self._for_model
        )
        return step(**kwargs)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        in_workflow = context.current_run.get() is not None and context.current_step.get() is None
        if not in_workflow or self.options.requires_approval is False:
            return self.step(*args, **kwargs)
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        try:
            _, shown = self.signature.validate(bound.arguments)
        except schema.InvalidArguments as exc:
            raise TypeError(f"tool {self.name!r}: {exc}") from None
        if not self.gated(shown):
            return self.step(*args, **kwargs)
        gates = approvals.open_gates([self.approval_request(shown, None)])
        deciding = approvals.decide(gates)
        return self._after_approval(gates[0], deciding, args, kwargs)

    async def _after_approval(
        self,
        gate: approvals.Gate,
        deciding: Coroutine[Any, Any, list[approvals.Decision]],
        args: Any,
        kwargs: Any,
    ) -> R:
        [decision] = await deciding
        approvals.close_gates([gate])
        if not decision.approved:
            raise exceptions.ApprovalRejected(self.name, decision.by, decision.reason)
        if decision.override_args is not None:
            args, kwargs = (), self.signature.validate(decision.override_args)[0]
        return await self.step(*args, **kwargs)


def _answers(retry: steps.Retry | None) -> steps.Retry | None:
    """A tool's retry policy, never retrying ToolError: that is the tool's answer to
    the model (or to the workflow that called it), not a failure to try again, and a
    retry would run the tool's side effects again."""
    if retry is None or issubclass(errors.ToolError, retry.dont_retry_on):
        return retry
    return dataclasses.replace(retry, dont_retry_on=(*retry.dont_retry_on, errors.ToolError))


#: What a tool's result is journaled as when the model called it: JSON data.
SeenByModel = dict[str, Any] | list[Any] | str | int | float | bool | None


def seen_by_model(value: Any) -> SeenByModel:
    """The JSON data of the text the model reads for ``value`` (``result_text``)."""
    if isinstance(value, str):
        return value
    seen: SeenByModel = json.loads(result_text(value))
    return seen


def _as_seen_by_model(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning ``seen_by_model`` of its result; sync stays sync (run in a thread)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_async(*args: Any, **kwargs: Any) -> SeenByModel:
            return seen_by_model(await fn(*args, **kwargs))

        call_async.__annotations__ = {**fn.__annotations__, "return": SeenByModel}
        return call_async

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):  # a sync callable that returned a coroutine
            return _seen_later(result)
        return seen_by_model(result)

    call.__annotations__ = {**fn.__annotations__, "return": SeenByModel}
    return call


async def _seen_later(result: Awaitable[Any]) -> SeenByModel:
    return seen_by_model(await result)


def result_text(value: Any) -> str:
    """A tool's result as the text of a ``tool`` message: strings as they are, the rest JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(schema.to_json(value), ensure_ascii=False, default=str)


def error_text(message: str) -> str:
    """The tool message for a call that did not produce a result: ``{"error": message}``."""
    return json.dumps({"error": message}, ensure_ascii=False)


def _seconds(value: float | datetime.timedelta | None) -> float | None:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if value is None:
        return None
    return validate.number(value, "approval_timeout", error=errors.DefinitionError)


@overload
def tool(fn: Callable[P, Awaitable[R]], /) -> Tool[P, R]: ...
@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: Approval = False,
    approval_timeout: float | datetime.timedelta | None = None,
    on_approval_timeout: approvals.OnTimeout = "reject",
    retry: steps.Retry | None = None,
    timeout: float | None = None,
    **step_options: Any,
) -> ToolDecorator: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: Approval = False,
    approval_timeout: float | datetime.timedelta | None = None,
    on_approval_timeout: approvals.OnTimeout = "reject",
    retry: steps.Retry | None = None,
    timeout: float | None = None,
    **step_options: Any,
) -> Any:
    """Make a function a tool: a durable step the model can call.

    ``name`` and ``description`` default to the function's name and the first
    paragraph of its docstring. ``requires_approval`` is True or a predicate
    over the arguments (as JSON, defaults filled in); a gated call parks the
    workflow until ``durably.approve``/``reject``. ``approval_timeout``
    (seconds or a timedelta) bounds the wait, and ``on_approval_timeout`` says
    what the silence means ("reject", the default, or "approve"). ``retry``,
    ``timeout`` and any other keyword (``reconcile=``, ``at_most_once=``) are
    the step's, as for ``@durably.step``.
    """
    options = ToolOptions(
        name,
        description,
        requires_approval,
        _seconds(approval_timeout),
        on_approval_timeout,
        retry,
        timeout,
        dict(step_options),
    )
    if fn is not None:
        return Tool(fn, options)
    return ToolDecorator(options)


class ToolDecorator:
    """``@durably.tool(...)`` with options."""

    def __init__(self, options: ToolOptions) -> None:
        self.options = options

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Tool[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Tool[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Any:
        return Tool(fn, self.options)
