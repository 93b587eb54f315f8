"""What the framework integrations share: the workflow check, the model step, its budget.

A model turn is journaled as ``{"response": ..., "model": ..., "usage": ...}``
where ``response`` is the framework's own serialization of its response and
``usage`` uses the chat completions field names (``prompt_tokens``,
``completion_tokens``, ``prompt_tokens_details.cached_tokens``), so
``durably show`` and :func:`durably.agents.usage_from_history` count the turns
of every integration the same way.

A run's budget (``max_cost=`` / ``max_tokens=``, see
:mod:`durably.agents.budget`) is held in a context variable for the duration of
``DurableAgent.run`` / ``DurableRunner.run``, so the framework's own model
objects (shared between runs) need not carry it; :func:`model_turn` enforces it
as durably's Agent does: before a request takes its seq, and in the step
before a request whose earlier answers were lost is asked again.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from durably import context, errors, steps
from durably.agents import budget, completions, usage

JSON = dict[str, Any]


def require_workflow(what: str) -> None:
    """Refuse to run ``what`` where its model calls could not be journaled.

    A durable agent run outside a workflow (or inside a step) would make every
    model request and tool call again after a crash, silently: the bug the
    wrapper exists to prevent. Run the unwrapped agent for a non-durable run.
    """
    run = context.current_run.get()
    if run is not None and context.current_step.get() is None:
        return
    where = "inside a step" if run is not None else "outside a workflow"
    raise errors.NotInWorkflow(
        f"{what} was called {where}; it journals its model requests and tool calls only "
        "in a @durably.workflow's own code. Call it from the workflow (not from a step), "
        "or run the unwrapped agent for a run that is not durable."
    )


def usage_record(prompt: int, completion: int, cached: int) -> JSON:
    """Token counts in the chat completions shape :mod:`durably.agents.usage` reads."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


@dataclasses.dataclass(slots=True)
class Turn:
    """One model request in flight; ``live`` is set when its step body ran in this process.

    ``lost_answer`` is the model step's ``reconcile``: the step then commits an
    intent before each request, so a request cut off by a crash is counted
    (``interrupted``) and asked again, and usage says "billed at least".
    """

    live: bool = False
    interrupted: int = 0

    def lost_answer(self, key: str, *args: Any) -> Any:
        """An interrupted request: count it; the provider cannot be asked, so NotFound."""
        self.interrupted += 1
        return steps.NotFound


def count_turn(record: Mapping[str, Any], turn: Turn, prices: Mapping[str, usage.Price]) -> None:
    """Add one journaled turn to the current run's meter, as billed or replayed."""
    meter = usage.run_meter()
    if meter is not None:
        meter.add(usage.tokens_of(record, prices), live=turn.live, interrupted=turn.interrupted)


#: The budget of the integration run in progress (set by the run methods).
_limits: contextvars.ContextVar[budget.Limits | None] = contextvars.ContextVar(
    "durably_integration_limits", default=None
)


def limits(default: budget.Limits, max_cost: float | None, max_tokens: int | None) -> budget.Limits:
    """``default`` with the limits given for one run put in its place."""
    return budget.Limits(
        default.max_cost if max_cost is None else max_cost,
        default.max_tokens if max_tokens is None else max_tokens,
    )


@contextlib.contextmanager
def budgeted(run_limits: budget.Limits) -> Iterator[None]:
    """Make ``run_limits`` the budget of the model turns taken inside the block."""
    token = _limits.set(run_limits if run_limits.set else None)
    try:
        yield
    finally:
        _limits.reset(token)


async def model_turn(
    ask: Callable[[], Awaitable[JSON]],
    *,
    name: str,
    retry: steps.Retry,
    prices: Mapping[str, usage.Price],
    model: str,
    request: Any,
) -> JSON:
    """Make (or replay) one model request as the step ``name``, counted and within budget.

    ``ask`` makes the request and returns its journal record; ``model`` and
    ``request`` (anything JSON-ish, sized to estimate a lost request's cost)
    price the repeated requests of a call whose answers were lost. Parks (as
    :mod:`durably.agents.budget` says) while the run's budget is reached.
    """
    run_limits = _limits.get()
    while True:
        if run_limits is not None:
            await budget.ensure(run_limits)
        turn = Turn()

        async def body(turn: Turn = turn) -> JSON:
            step = context.current_step.get()
            attempt = step.attempt if step is not None else 1
            estimate = {"model": model, "messages": request}
            budget.refuse_if_reached(run_limits, estimate, attempt, prices)
            record = await ask()
            turn.live = True
            return completions.noted(record)  # the attempts, for replays to count them too

        try:
            record: JSON = await steps.run_step(
                body, name=name, retry=retry, reconcile=turn.lost_answer
            )
        except errors.BudgetExceeded as exc:  # refused before asking again: park
            if run_limits is None:
                raise
            meter = usage.run_meter()
            budget.count_refused(exc, (meter,))
            await budget.park(run_limits, str(exc), meter.charged if meter else usage.Tokens())
            continue
        turn.interrupted = completions.earlier_requests(record)
        count_turn(record, turn, prices)
        return record
