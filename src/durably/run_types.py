"""The values a workflow run is made of, apart from its state (see :mod:`durably.runstate`).

What a run needs from its engine (:class:`Services`), one wait of it
(:class:`Block`), an undo registered for it (:class:`Compensation`), how it ended
the workflow (:class:`Outcome`), and the two
BaseExceptions that unwind it (:class:`Abandoned`, :class:`Suspended`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from durably import step_keys, step_threads
from durably.storage import thread


class Abandoned(BaseException):
    """Unwinds a run whose database stopped answering: nothing more of it can be written.

    A BaseException so that workflow code cannot catch it and go on with a gap
    in its journal; recovery resumes the workflow from what was committed.
    """


class Suspended(BaseException):
    """Unwinds a workflow that must stop here and be resumed later (engine draining).

    A BaseException so that a workflow's own ``except Exception`` cannot swallow it.
    """


class Outcome(NamedTuple):
    """How a run ended the workflow, as committed: what its handles return or raise."""

    status: str
    output: str | None
    error: str | None


@dataclasses.dataclass(slots=True)
class Services:
    """What a run needs from its engine."""

    store: thread.StoreThread
    clock: Callable[[], float]
    step_threads: step_threads.StepThreads
    stopping: asyncio.Event
    on_park: Callable[[float | None], None] = lambda wake_at: None
    on_child: Callable[[str], None] = lambda child_id: None
    on_signal: Callable[[str, str], None] = lambda workflow_id, name: None
    on_event: Callable[[str, str], None] = lambda workflow_id, key: None
    hold_seconds: float = 1.0  # how long a blocked run stays in memory before it parks
    inline_commits: bool = True  # commit on the loop's thread when nothing else is ready
    commit_patience: float = 30.0  # seconds to wait out a locked or unreachable database
    full_patience: float = 600.0  # seconds to wait for room in a full database
    strict_replay: bool = False  # a replayed step called with other arguments diverges


@dataclasses.dataclass(slots=True)
class Block:
    """One branch of a run waiting for a timer, a signal or a child."""

    future: asyncio.Future[None]
    kind: str  # journal.Kind.SLEEP, SIGNAL or JOIN
    key: str  # the signal's name or the child's id
    wake_at: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class Compensation:
    """An undo registered with ``durably.compensate``, run as a step if the workflow fails."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str
    #: The seq of the durable call the registering task made last (0: none), and which
    #: undo it registered since (``Run.undo_order``): the order the undos run in, the
    #: same on a replay when tasks ran at once (registration order then depends on
    #: which task's replayed calls come back first).
    after: int = 0
    nth: int = 1

    def order(self) -> tuple[int, int, str, str]:
        """Its place among the undos (run newest first); tasks started together tie on
        the call and count, and are told apart by the undo's name and arguments (those
        that cannot be encoded by their class)."""
        digest = step_keys.args_digest(self.args, self.kwargs)
        if digest is None:
            digest = step_keys.partial_digest(self.args, self.kwargs)
        return (self.after, self.nth, self.name, digest)


#: The block kind of a step waiting for a person's decision (see step_call).
REVIEW = "review"
