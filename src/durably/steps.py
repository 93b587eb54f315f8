"""``@durably.step``, ``Retry`` and ``run_step``: the unit of durability.

The decorator only records metadata and fails at decoration time when the
options are wrong. Calling a step inside a workflow takes its seq at once, in
program order, and returns the awaitable that runs it under the commit protocol
(see :mod:`durably.runtime`). Outside a workflow, or inside another step, a step
is an ordinary function call (still awaited), so steps are easy to unit-test.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from durably import context, errors

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
    ``dont_retry_on`` are retried.
    """

    max_attempts: int = 3
    initial: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise errors.DefinitionError(f"Retry(max_attempts={self.max_attempts}): must be >= 1")
        if self.initial < 0 or self.max_delay < 0:
            raise errors.DefinitionError("Retry delays must be >= 0")
        if self.backoff < 1:
            raise errors.DefinitionError(f"Retry(backoff={self.backoff}): must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise errors.DefinitionError(f"Retry(jitter={self.jitter}): must be within [0, 1]")

    def delay_after(self, attempt: int, exc: BaseException) -> float | None:
        """Seconds to wait before the next attempt, or None when there is none."""
        if attempt >= self.max_attempts:
            return None
        if not isinstance(exc, self.retry_on) or isinstance(exc, self.dont_retry_on):
            return None
        base = min(self.initial * self.backoff ** (attempt - 1), self.max_delay)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))


@dataclasses.dataclass(frozen=True, slots=True)
class StepDefinition:
    """A step's function and options, as the runtime needs them."""

    fn: Callable[..., Any]
    name: str
    is_async: bool
    retry: Retry | None = None
    timeout: float | None = None


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


def _define(
    fn: Callable[..., Any], name: str | None, retry: Retry | None, timeout: float | None
) -> StepDefinition:
    if isinstance(fn, StepFunction):
        raise errors.DefinitionError(f"{fn!r} is already a step")
    if not callable(fn):
        raise errors.DefinitionError(f"@durably.step needs a function, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise errors.DefinitionError(
            f"{fn.__qualname__} is a generator; a step must return its result"
        )
    if retry is not None and not isinstance(retry, Retry):
        raise errors.DefinitionError(f"retry= takes a durably.Retry, got {type(retry).__name__}")
    if timeout is not None and timeout <= 0:
        raise errors.DefinitionError(f"timeout={timeout}: must be > 0 seconds")
    return StepDefinition(
        fn=fn,
        name=name or getattr(fn, "__qualname__", None) or repr(fn),
        is_async=inspect.iscoroutinefunction(fn),
        retry=retry,
        timeout=timeout,
    )


@overload
def step(fn: Callable[P, Awaitable[R]], /) -> StepFunction[P, R]: ...
@overload
def step(fn: Callable[P, R], /) -> StepFunction[P, R]: ...
@overload
def step(
    *, name: str | None = None, retry: Retry | None = None, timeout: float | None = None
) -> _StepDecorator: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
) -> Any:
    """Make a function a durable step: its result is journaled before the workflow goes on.

    ``retry`` retries it when it raises (back-off is a durable wait);
    ``timeout`` bounds one attempt in seconds (a sync step's thread cannot be
    interrupted: it is abandoned, and the attempt fails with StepTimeout). A
    crash during a step re-runs it on recovery with the same idempotency key.
    """
    if fn is not None:
        return StepFunction(_define(fn, name, retry, timeout))
    return _StepDecorator(name, retry, timeout)


class _StepDecorator:
    """``@durably.step(...)`` with options."""

    def __init__(self, name: str | None, retry: Retry | None, timeout: float | None) -> None:
        _define(lambda: None, name, retry, timeout)  # fail now on bad options
        self._name, self._retry, self._timeout = name, retry, timeout

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> StepFunction[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> StepFunction[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Any:
        return StepFunction(_define(fn, self._name, self._retry, self._timeout))


def run_step(
    fn: Callable[..., Awaitable[R]] | Callable[..., R],
    *args: Any,
    name: str | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> Coroutine[Any, Any, R]:
    """Run ``fn(*args, **kwargs)`` as a one-off durable step, without a decorator.

    Like a decorated step, the seq is taken at the call, so await it in order
    or gather it.
    """
    definition = _define(fn, name, retry, timeout)
    return StepFunction[Any, R](definition)(*args, **kwargs)
