"""Budgets that survive crashes: ``max_cost=`` / ``max_tokens=`` over a run's model calls.

A budget is counted from the journal, not from a process's memory: every
answered model call of the workflow run (replayed or billed), once per request
made for it (a model step journals how many attempts it took, so a request
whose answer a crash lost is counted like the answer that followed). A crash
loop therefore cannot spend past a budget: each restart replays the same
count.

It is checked at two places:

- in the workflow, before a model call takes its seq: when the count has
  reached a limit the run parks (status ``waiting``) on the signal
  :data:`SIGNAL`, after publishing the event :data:`SIGNAL` (what was spent,
  the limits). Deterministic: the count is rebuilt from the journal on replay.
- in the model step, before the request: earlier requests of this very call
  (lost to crashes, no answer journaled yet) are priced like the largest call
  so far (or, before any, by the request's size) and added. When that reaches
  a limit the step fails with :class:`~durably.errors.BudgetExceeded` without
  asking the provider; the failure is journaled, the call parks as above and
  is made again at a new seq once the budget is raised.

A person raises the budget (``set_budget(client, id, by=..., max_cost=...)``
or ``durably budget ID --max-cost 5 --by alice``), which applies to the rest of
the run, or stops it (``stop=True``): the model call then raises
BudgetExceeded in the workflow. One request in flight can cross a limit; no
request starts after it was reached.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from durably import context, errors, waits
from durably.agents import usage

if TYPE_CHECKING:
    from durably.client import Client
    from durably.engine import Engine

#: The signal that raises (or stops) a run's budget, and the event saying why it waits.
SIGNAL = "durably:budget"


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """A run's model budget: dollars (priced by the caller's table) and/or tokens."""

    max_cost: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_cost is not None and self.max_cost < 0:
            raise errors.DefinitionError(f"max_cost={self.max_cost}: must be >= 0")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise errors.DefinitionError(f"max_tokens={self.max_tokens}: must be >= 0")

    @property
    def set(self) -> bool:
        """Whether any limit is given."""
        return self.max_cost is not None or self.max_tokens is not None

    def reached(self, spent: usage.Tokens) -> str | None:
        """Why ``spent`` is at or past a limit, or None."""
        if self.max_tokens is not None and spent.total_tokens >= self.max_tokens:
            return f"{spent.total_tokens:,} tokens of max_tokens={self.max_tokens:,}"
        if self.max_cost is not None and spent.cost >= self.max_cost:
            return f"${spent.cost:.4f} of max_cost=${self.max_cost:.4f}"
        return None


@dataclasses.dataclass(slots=True)
class _Raised:
    """The last raise a person sent in this run (``Run.local``)."""

    limits: Limits | None = None


def effective(limits: Limits) -> Limits:
    """The limits in force in the current run: the last raise a person sent, else ``limits``."""
    run = context.current_run.get()
    raised = None if run is None else run.local(_Raised, _Raised).limits
    return limits if raised is None else raised


async def ensure(limits: Limits) -> None:
    """In workflow code, before a model call: park while the run's count has reached a limit."""
    if not limits.set or context.current_run.get() is None:
        return
    meter = usage.run_meter()
    spent = meter.charged if meter is not None else usage.Tokens()
    while (why := effective(limits).reached(spent)) is not None:
        await park(limits, why, spent)


async def park(limits: Limits, why: str, spent: usage.Tokens) -> None:
    """Wait (parked) for a person to raise the budget; BudgetExceeded if they stop the run."""
    run = context.current_run.get()
    current = effective(limits)
    waits.set_event(
        SIGNAL,
        {
            "reached": why,
            "spent": {"tokens": spent.total_tokens, "cost": spent.cost, "calls": spent.calls},
            "max_cost": current.max_cost,
            "max_tokens": current.max_tokens,
        },
    )
    decision = await waits.wait_for_signal(SIGNAL)
    if not isinstance(decision, Mapping):
        decision = {}
    by = str(decision.get("by") or "someone")
    if decision.get("stop"):
        raise errors.BudgetExceeded(f"model budget reached ({why}); stopped by {by}")
    raised = Limits(
        max_cost=_number(decision.get("max_cost"), current.max_cost),
        max_tokens=_integer(decision.get("max_tokens"), current.max_tokens),
    )
    if run is not None:
        run.local(_Raised, _Raised).limits = raised


def refuse_if_reached(
    limits: Limits | None,
    params: Mapping[str, Any],
    attempt: int,
    prices: Mapping[str, usage.Price],
) -> None:
    """In the model step, before the request: BudgetExceeded if earlier lost requests reach it."""
    if limits is None or not limits.set or attempt <= 1:
        return
    meter = usage.run_meter()
    if meter is None:
        return
    estimate = meter.largest if meter.largest.calls else _by_size(params, prices)
    spent = meter.charged + estimate.times(attempt - 1)
    why = effective(limits).reached(spent)
    if why is not None:
        exc = errors.BudgetExceeded(
            f"model budget reached before asking again ({why}, counting {attempt - 1} earlier "
            "request(s) of this call whose answers were lost)"
        )
        # journaled with the error (durably.errorstate), so a replay counts them too
        exc.lost = estimate.times(attempt - 1)  # type: ignore[attr-defined]
        exc.lost_requests = attempt - 1  # type: ignore[attr-defined]
        raise exc


def count_refused(exc: errors.BudgetExceeded, meters: Iterable[usage.Meter | None]) -> None:
    """Count the lost requests of a call the step refused (from the journaled error)."""
    lost = getattr(exc, "lost", None)
    requests = getattr(exc, "lost_requests", 0)
    if isinstance(lost, usage.Tokens) and isinstance(requests, int):
        for meter in meters:
            if meter is not None:
                meter.add_lost(lost, requests)


def _by_size(params: Mapping[str, Any], prices: Mapping[str, usage.Price]) -> usage.Tokens:
    """A request's prompt tokens guessed from its size (4 characters a token), priced."""
    prompt = len(json.dumps(params.get("messages") or [], default=str)) // 4
    price = usage.price_for(str(params.get("model") or ""), prices)
    cost = price.cost(prompt, 0, 0) if price else 0.0
    return usage.Tokens(1, prompt, 0, 0, cost, 0 if price else 1)


def _number(value: Any, default: float | None) -> float | None:
    return float(value) if isinstance(value, int | float) else default


def _integer(value: Any, default: int | None) -> int | None:
    return int(value) if isinstance(value, int | float) else default


def set_budget(
    target: Client | Engine,
    workflow_id: str,
    *,
    by: str,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    stop: bool = False,
) -> Any:
    """Raise a parked run's budget (new absolute limits), or ``stop=True`` to end it.

    With a Client the signal is committed before this returns; with an Engine
    it returns the coroutine to await. Limits not given stay as they were.
    """
    if not by:
        raise ValueError("a budget decision needs by= (who made it)")
    if not stop and max_cost is None and max_tokens is None:
        raise ValueError("give max_cost=, max_tokens= or stop=True")
    Limits(max_cost, max_tokens)  # checks the values
    payload = {"by": by, "max_cost": max_cost, "max_tokens": max_tokens, "stop": stop}
    sent: bool | Coroutine[Any, Any, bool] = target.send_signal(workflow_id, SIGNAL, payload)
    return sent
