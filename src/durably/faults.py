"""Crash injection at the engine's commit boundaries, for tests of real SIGKILLs.

Off unless the environment asks for it, and then it kills its own process with
SIGKILL exactly where it was told, so crash tests exercise the real recovery
path rather than a simulated one:

- ``DURABLY_CRASH_AT=POINT[:STEP][@N]``: die the Nth time (default 1st) the
  engine reaches POINT (for STEP, when given). Points: ``engine_start``,
  ``before_intent``, ``after_intent`` (steps with reconcile= or at_most_once=),
  ``before_call``, ``after_call``, ``after_receipt``, ``in_backoff``,
  ``before_finish``, ``after_finish`` (the final status committed), ``after_send``
  (a workflow's ``send_signal`` committed; STEP is the signal's name),
  ``before_wait`` and ``after_wait`` (the outcome of a ``durably.wait`` or
  ``wait_first`` race decided, before and after its commit; STEP is its
  ``return_when``, or ``wait_first``).
- ``DURABLY_CRASH_AT=#N``: die at the Nth boundary of any kind.
- ``DURABLY_CRASH_ONCE=PATH``: only if PATH does not exist; it is created just
  before dying, so a restarted process goes through.

An :class:`Observer` (``observe(...)``) hears every boundary, every call of a
step function and every committed batch of entries, before any crash: the
shipped test kit (``durably test-crashes``) records them this way instead of
replacing engine functions at run time, so a refactor of the engine cannot
silently stop it from counting. The engine reports through the module
functions :func:`reached`, :func:`step_called` and :func:`committed`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from durably.context import StepContext
    from durably.journal import Entry
    from durably.steps import StepDefinition

POINTS = (
    "engine_start",
    "before_intent",
    "after_intent",
    "before_call",
    "after_call",
    "after_receipt",
    "in_backoff",
    "before_finish",
    "after_finish",
    "after_send",
    "before_wait",
    "after_wait",
)


class _Plan:
    __slots__ = ("count", "nth", "point", "step")

    def __init__(self, spec: str) -> None:
        self.count = 0
        head, _, nth = spec.partition("@")
        self.nth = int(nth) if nth else 1
        if head.startswith("#"):
            self.point, self.step, self.nth = None, None, int(head[1:])
            return
        point, _, step = head.partition(":")
        if point not in POINTS:
            raise ValueError(
                f"DURABLY_CRASH_AT={spec!r}: unknown point {point!r}; use one of {POINTS}"
            )
        self.point = point
        self.step = step or None


class Observer(Protocol):
    """What a probe of the engine hears (called on the event loop; keep it quick)."""

    def reached(self, point: str, step: str) -> None:
        """The engine reached a boundary (heard before a crash planned there)."""

    def step_called(self, step: StepDefinition, ctx: StepContext) -> None:
        """A step function is about to be called (an attempt, compensations included)."""

    def committed(self, workflow_id: str, entries: Sequence[Entry]) -> None:
        """A run's batch of journal entries is durable."""


_plan: _Plan | None = None
_observer: Observer | None = None


def configure(spec: str | None) -> None:
    """Set (or with None clear) the crash plan of this process."""
    global _plan
    _plan = _Plan(spec) if spec else None


def observe(observer: Observer | None) -> None:
    """Set (or with None clear) the observer of this process."""
    global _observer
    _observer = observer


def step_called(step: StepDefinition, ctx: StepContext) -> None:
    """Tell the observer, if any, that a step function is about to be called."""
    if _observer is not None:
        _observer.step_called(step, ctx)


def committed(workflow_id: str, entries: Sequence[Entry]) -> None:
    """Tell the observer, if any, that a run's entries are durable."""
    if _observer is not None:
        _observer.committed(workflow_id, entries)


def reached(point: str, step: str = "") -> None:
    """Mark that the engine reached a boundary; dies there if the plan says so."""
    if _observer is not None:
        _observer.reached(point, step)
    plan = _plan
    if plan is None:
        return
    if plan.point is not None and (point != plan.point or (plan.step and step != plan.step)):
        return
    plan.count += 1
    if plan.count != plan.nth:
        return
    marker = os.environ.get("DURABLY_CRASH_ONCE")
    if marker:
        if os.path.exists(marker):
            return
        with open(marker, "w") as fh:
            fh.write(f"{point}:{step}\n")
            fh.flush()
            os.fsync(fh.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


configure(os.environ.get("DURABLY_CRASH_AT"))
