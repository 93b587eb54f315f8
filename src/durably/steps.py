"""``@durably.step``, ``Retry`` and ``run_step``: the unit of durability.

The decorator only records metadata and fails at decoration time when the
options are wrong. Calling a step inside a workflow takes its seq at once, in
program order, and returns the awaitable that runs it under the commit protocol
(see :mod:`durably.workflow_run`). Outside a workflow, or inside another step, a step
is an ordinary function call (still awaited), so steps are easy to unit-test.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from durably import context, errors, validate

log = logging.getLogger("durably")

P = ParamSpec("P")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """How a step is retried when it raises: exponential back-off with jitter.

    ``max_attempts`` counts the first try. The delay before attempt n+1 is
    ``initial * backoff**(n-1)`` capped at ``max_delay``, then spread by
    ``jitter`` (a fraction, 0.1 = plus or minus 10%). The wake-up time is
    journaled, so a crash during the back-off waits only what is left of it.
    Only exceptions that are instances of ``retry_on`` and not of
    ``dont_retry_on`` are retried, and, with ``should_retry``, only those
    for which ``should_retry(exc)`` is true (an HTTP error's status code, say).
    A ``should_retry`` that raises counts as false: the step fails with its own
    error, not the predicate's. ``delay_from(exc)`` may name the delay itself
    (an HTTP 429's Retry-After), capped at ``max_delay``.
    """

    max_attempts: int = 3
    initial: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()
    delay_from: Callable[[BaseException], float | None] | None = None
    should_retry: Callable[[BaseException], bool] | None = None

    def __post_init__(self) -> None:
        bad = errors.DefinitionError
        for option in ("should_retry", "delay_from"):
            given = getattr(self, option)
            if given is not None and not callable(given):
                raise bad(f"Retry({option}) must be a function of the exception, not {given!r}")
        validate.count(self.max_attempts, "Retry(max_attempts)", error=bad)
        validate.number(self.initial, "Retry(initial)", error=bad)
        validate.number(self.backoff, "Retry(backoff)", low=1.0, error=bad)
        validate.number(self.max_delay, "Retry(max_delay)", error=bad)
        validate.number(self.jitter, "Retry(jitter)", high=1.0, error=bad)

    def delay_after(self, attempt: int, exc: BaseException) -> float | None:
        """Seconds to wait before the next attempt, or None when there is none."""
        if attempt >= self.max_attempts:
            return None
        if not isinstance(exc, self.retry_on) or isinstance(exc, self.dont_retry_on):
            return None
        if self.should_retry is not None and not _asks_retry(self.should_retry, exc):
            return None
        asked = self.delay_from(exc) if self.delay_from is not None else None
        if asked is not None and not math.isnan(asked):  # NaN: use the usual back-off
            return min(max(0.0, asked), self.max_delay)
        base = min(self.initial * self.backoff ** (attempt - 1), self.max_delay)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))


def _asks_retry(should_retry: Callable[[BaseException], bool], exc: BaseException) -> bool:
    """What the predicate says; one that raises says no (the step's error stays the one
    raised; the predicate's is logged)."""
    try:
        return bool(should_retry(exc))
    except Exception:
        log.exception("Retry(should_retry) raised on %r: not retrying", exc)
        return False


class _Verdict:
    """A reconcile answer that carries no result (``NotFound``, ``Unknown``)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"durably.{self._name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """Reconcile's answer: the effect happened; ``result`` becomes the step's receipt."""

    result: Any


NotFound = _Verdict("NotFound")
"""Reconcile's answer: the effect did not happen; the step may run again with its key."""

Unknown = _Verdict("Unknown")
"""Reconcile's answer: nobody can tell; the workflow waits in ``needs_review``."""

Reconcile = Callable[..., Any]


@dataclasses.dataclass(frozen=True, slots=True)
class StepDefinition:
    """A step's function and options, as the runtime needs them.

    ``reconcile`` or ``at_most_once`` make the step commit an intent before it
    runs, so a crash leaves a record that its outcome is unknown.
    """

    fn: Callable[..., Any]
    name: str
    is_async: bool
    retry: Retry | None = None
    timeout: float | None = None
    reconcile: Reconcile | None = None
    at_most_once: bool = False

    @property
    def needs_intent(self) -> bool:
        """Whether the runtime commits an intent before calling the function."""
        return self.reconcile is not None or self.at_most_once


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """The keyword options of ``@durably.step(...)`` and ``run_step``."""

    name: str | None = None
    retry: Retry | None = None
    timeout: float | None = None
    reconcile: Reconcile | None = None
    at_most_once: bool = False


class StepFunction(Generic[P, R]):
    """A decorated step: call it (and await the call) like the original function."""

    def __init__(self, definition: StepDefinition) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        run = context.current_run.get()
        if run is None or context.current_step.get() is not None:
            return _plain(self.definition, args, kwargs)
        return run.call_step(self.definition, args, kwargs)

    def __repr__(self) -> str:
        return f"<durably step {self.definition.name!r}>"


async def _plain(step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = step.fn(*args, **kwargs)
    if step.is_async:
        return await result
    return result


def define(fn: Callable[..., Any], options: Options) -> StepDefinition:
    """Check a function and its options at decoration time; its step definition."""
    if isinstance(fn, StepFunction):
        raise errors.DefinitionError(f"{fn!r} is already a step")
    if not callable(fn):
        raise errors.DefinitionError(f"@durably.step needs a function, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise errors.DefinitionError(
            f"{fn.__qualname__} is a generator; a step must return its result"
        )
    if options.retry is not None and not isinstance(options.retry, Retry):
        raise errors.DefinitionError(
            f"retry= takes a durably.Retry, got {type(options.retry).__name__}"
        )
    if options.timeout is not None:
        validate.number(options.timeout, "timeout", above=True, error=errors.DefinitionError)
    if options.name is not None:
        validate.name(options.name, "step name")
    if options.reconcile is not None and not callable(options.reconcile):
        raise errors.DefinitionError("reconcile= takes a function (key, *args) -> Found | NotFound")
    if options.reconcile is not None and options.at_most_once:
        raise errors.DefinitionError(
            "choose reconcile= or at_most_once=True: reconcile already decides what to do"
        )
    return StepDefinition(
        fn=fn,
        name=options.name or getattr(fn, "__qualname__", None) or repr(fn),
        is_async=inspect.iscoroutinefunction(fn),
        retry=options.retry,
        timeout=options.timeout,
        reconcile=options.reconcile,
        at_most_once=options.at_most_once,
    )


@overload
def step(fn: Callable[P, Awaitable[R]], /) -> StepFunction[P, R]: ...
@overload
def step(fn: Callable[P, R], /) -> StepFunction[P, R]: ...
@overload
def step(
    *,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    reconcile: Reconcile | None = None,
    at_most_once: bool = False,
) -> _StepDecorator: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    reconcile: Reconcile | None = None,
    at_most_once: bool = False,
) -> Any:
    """Make a function a durable step: its result is journaled before the workflow goes on.

    ``retry`` retries it when it raises (back-off is a durable wait);
    ``timeout`` bounds one attempt in seconds (a sync step's thread cannot be
    interrupted: it is abandoned, and the attempt fails with StepTimeout). A
    crash during a plain step re-runs it on recovery with the same idempotency
    key. With ``reconcile=fn``, a crash instead calls ``fn(key, *args)``, which
    returns ``Found(result)``, ``NotFound`` or ``Unknown``; with
    ``at_most_once=True`` a crash parks the workflow in ``needs_review``.
    """
    options = Options(name, retry, timeout, reconcile, at_most_once)
    if fn is not None:
        return StepFunction(define(fn, options))
    return _StepDecorator(options)


class _StepDecorator:
    """``@durably.step(...)`` with options."""

    def __init__(self, options: Options) -> None:
        define(lambda: None, options)  # fail now on bad options
        self._options = options

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> StepFunction[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> StepFunction[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Any:
        return StepFunction(define(fn, self._options))


def run_step(
    fn: Callable[..., Awaitable[R]] | Callable[..., R],
    *args: Any,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    reconcile: Reconcile | None = None,
    at_most_once: bool = False,
    **kwargs: Any,
) -> Coroutine[Any, Any, R]:
    """Run ``fn(*args, **kwargs)`` as a one-off durable step, without a decorator.

    Like a decorated step, the seq is taken at the call, so await it in order
    or gather it.
    """
    if isinstance(fn, StepFunction):  # a decorated step keeps its options; name= may rename it
        if name is not None:
            validate.name(name, "step name")
        definition = dataclasses.replace(fn.definition, name=name or fn.definition.name)
    else:
        definition = define(fn, Options(name, retry, timeout, reconcile, at_most_once))
    return StepFunction[Any, R](definition)(*args, **kwargs)
