"""The context variables through which workflow-side calls reach the engine.

User code never imports the engine: ``durably.now()`` or a step call looks up
the current run here. A step body runs with a :class:`StepContext`, which is
also how nested step calls know to run plainly.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import TYPE_CHECKING

from durably import errors

if TYPE_CHECKING:
    from durably.workflow_run import Run


@dataclasses.dataclass(frozen=True, slots=True)
class StepContext:
    """What a running step may ask about itself."""

    workflow_id: str
    seq: int
    name: str
    attempt: int
    idempotency_key: str
    #: The ``(key, value JSON)`` events the step set (``durably.set_event`` in its body):
    #: published with its receipt, dropped with a failed attempt.
    events: list[tuple[str, str]] = dataclasses.field(
        default_factory=list, compare=False, repr=False
    )


current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "durably_run", default=None
)
current_step: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "durably_step", default=None
)


def require_run(what: str) -> Run:
    """The running workflow, or NotInWorkflow naming the call that needs one."""
    run = current_run.get()
    if run is None or current_step.get() is not None:
        where = "inside a step" if run is not None else "outside a workflow"
        raise errors.NotInWorkflow(
            f"durably.{what}() was called {where}; it is only valid in a workflow's own code"
        )
    return run


def workflow_id() -> str:
    """The id of the workflow whose code (or step) is running: for logs, keys, messages."""
    step = current_step.get()
    if step is not None:
        return step.workflow_id
    run = current_run.get()
    if run is None:
        raise errors.NotInWorkflow(
            "durably.workflow_id() was called outside a workflow; it is valid in a "
            "workflow's code and in its steps"
        )
    return run.workflow_id


def idempotency_key() -> str:
    """The idempotency key of the step now running: stable across its attempts and recoveries.

    It is ``"<workflow_id>:<seq>"`` in a workflow of one task; the workflow function's
    own calls are counted (``"<workflow_id>:<n>"``) and another task's step is keyed by
    what it is (``"<workflow_id>:<after>.<digest>"``, ``durably.step_keys``). It differs
    for every call of every step.
    """
    step = current_step.get()
    if step is None:
        raise errors.NotInWorkflow("durably.idempotency_key() is only valid inside a step")
    return step.idempotency_key


def step_info() -> StepContext:
    """The context of the step now running (workflow id, seq, name, attempt, key)."""
    step = current_step.get()
    if step is None:
        raise errors.NotInWorkflow("durably.step_info() is only valid inside a step")
    return step
