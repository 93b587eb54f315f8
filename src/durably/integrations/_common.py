"""What the framework integrations share: the workflow check and the usage record of a turn.

A model turn is journaled as ``{"response": ..., "model": ..., "usage": ...}``
where ``response`` is the framework's own serialization of its response and
``usage`` uses the chat completions field names (``prompt_tokens``,
``completion_tokens``, ``prompt_tokens_details.cached_tokens``), so
``durably show`` and :func:`durably.agents.usage_from_history` count the turns
of every integration the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from durably import context, errors, steps
from durably.agents import usage

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
