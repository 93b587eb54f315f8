"""The records durably keeps: journal entries, workflow rows, claims and executors.

Pure data with no I/O. A journal entry is the current state of one durable call
at one seq: a step's receipt (or its intent, or its last failed attempt), a
journaled value such as ``now()``, a timer, a signal. ``(workflow_id, seq)`` is
unique, so a step that is retried updates its own entry instead of adding one.
"""

from __future__ import annotations

import dataclasses
import enum


class Status(enum.StrEnum):
    """The lifecycle of a workflow."""

    PENDING = "pending"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    NEEDS_REVIEW = "needs_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DIVERGED = "diverged"

    @property
    def finished(self) -> bool:
        """True for the statuses a workflow never leaves without a person's help."""
        return self in _FINISHED


_FINISHED = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.DIVERGED})
#: The final statuses of a workflow, sorted (queries.sql spells them out; a test checks).
FINISHED_STATUSES: tuple[str, ...] = tuple(sorted(s.value for s in _FINISHED))
#: A workflow that an executor runs, or that any executor may claim once its lease is gone.
LIVE_STATUSES = frozenset({Status.PENDING, Status.RUNNING})
#: A parked workflow: no owner; claimable when its ``wake_at`` is due.
PARKED_STATUSES = frozenset({Status.SLEEPING, Status.WAITING, Status.NEEDS_REVIEW})
#: A parked workflow that a signal or a child's end wakes: one waiting, or one whose
#: step awaits a person while another of its tasks may wait for the signal or child.
#: (A sleeping one waits for its timers only.)
MESSAGED_STATUSES = frozenset({Status.WAITING, Status.NEEDS_REVIEW})
#: A workflow whose ``wake_at`` is a time the engine acts at: a delayed start or a parked
#: workflow's timer (the timer loop's ``next_wake`` reads them in one index range).
TIMED_STATUSES = frozenset({Status.PENDING}) | PARKED_STATUSES
#: Every status but the final ones (the dashboard counts them at every look).
UNFINISHED_STATUSES = LIVE_STATUSES | PARKED_STATUSES


class Kind(enum.StrEnum):
    """What a journal entry records."""

    STEP = "step"
    NOW = "now"
    RANDOM = "random"
    UUID4 = "uuid4"
    SLEEP = "sleep"  # wake_at holds the absolute wake-up time
    SIGNAL = "signal"  # name is the signal's name; payload what was received
    EVENT = "event"  # name is the key; payload the value published
    CHILD = "child"  # name is the child workflow's name; payload its id
    JOIN = "join"  # name is the child's id; payload its outcome
    CANCEL = "cancel"  # the cancellation was delivered at this seq
    PATCH = "patch"  # name is the change id: the code took durably.patched()'s new path here
    WAIT = "wait"  # name is return_when; payload which of the awaitables had finished
    SEND = "send_signal"  # name is "<signal> -> <target id>"; sent with key "<id>:<seq>"
    GET_EVENT = "get_event"  # name is "<key> of <workflow id>"; payload the value read


class EntryStatus(enum.StrEnum):
    """The state of one durable call."""

    STARTED = "started"  # an intent: the call may have reached the outside world
    RETRYING = "retrying"  # the last attempt failed; the next one is due at wake_at
    COMPLETED = "completed"  # the receipt: payload holds the result
    FAILED = "failed"  # final: payload holds the error, re-raised on every replay
    TIMED_OUT = "timed_out"  # final: a wait whose deadline passed


#: The entry statuses a call never leaves: the upsert refuses to change such an entry,
#: and replay returns (or raises) it as it is.
FINAL_ENTRY_STATUSES = frozenset({EntryStatus.COMPLETED, EntryStatus.FAILED, EntryStatus.TIMED_OUT})
#: The others: a call still open (an intent without its receipt, a retry to come). Only
#: these entries ever change, so they, the count and the last seq tell a journal's state.
OPEN_ENTRY_STATUSES = frozenset(EntryStatus) - FINAL_ENTRY_STATUSES


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One journal entry: the state of the durable call at ``seq``."""

    seq: int
    kind: str
    name: str
    status: str
    attempt: int = 1
    payload: str | None = None  # JSON text: the result, or the error of a failed attempt
    started_at: float | None = None
    finished_at: float | None = None
    wake_at: float | None = None  # when a retrying step may try again
    #: A step's arguments as a short digest of their encoded JSON, checked on replay
    #: (None: not a step, arguments that cannot be encoded, or journaled before 0.2).
    #: ``#n`` follows it for a step called by a task the workflow function started, the
    #: n-th of identical calls after the same one (``twin_of``).
    args_digest: str | None = None
    #: The seq of the call the same task made before this one, where that is not
    #: ``seq - 1`` (None): a call of one of the tasks a workflow runs at once, which a
    #: replay matches by it, whatever order the tasks come back in (``replay.Replayer``).
    #: Seq 1 holds 0: a journal whose seq 1 holds None was begun before they were kept.
    follows: int | None = None

    def describe(self) -> str:
        """The call as people name it: ``step 'issue_refund'``."""
        return describe_call(self.kind, self.name)

    @property
    def duration(self) -> float | None:
        """Seconds the last attempt took, when both ends are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


def twinned(digest: str | None, twin: int) -> str:
    """The ``args_digest`` journaled for a step called by a task the workflow function
    started (``step_keys``): the ``twin``-th (from 1) of identical calls after the same
    one, the same step with the same arguments, told apart only by it."""
    return f"{digest or ''}#{twin}"


def twin_of(args_digest: str | None) -> tuple[str | None, int]:
    """An ``args_digest`` as journaled, split: (the arguments' digest, which twin); twin 0
    for a call of the workflow function's own task (its digest alone)."""
    if args_digest is None or "#" not in args_digest:
        return args_digest, 0
    digest, _, twin = args_digest.partition("#")
    return digest or None, int(twin)


def describe_call(kind: str, name: str) -> str:
    """Name a durable call for error messages."""
    return f"{kind} {name!r}" if name else kind


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow's row: identity, status, owner and outcome."""

    workflow_id: str
    name: str
    status: str
    input: str
    version: str | None = None
    source_hash: str | None = None
    output: str | None = None
    error: str | None = None
    owner: str | None = None
    epoch: int = 0
    lease_expires_at: float | None = None
    crash_count: int = 0
    wake_at: float | None = None
    parent_id: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    cancel_requested: int = 0
    queue: str | None = None  # the queue it was enqueued on, if any
    priority: int = 0  # within its queue, higher is claimed first
    forked_from: str | None = None  # the workflow this one is a fork of, if it is one
    forked_from_seq: int | None = None  # the last seq of the prefix the fork copied
    max_recoveries: int | None = None  # crashes in a row it may survive; None: the engine's
    #: What replays found and went on past (a step called with other arguments), a line each.
    warnings: str | None = None
    #: When it is cancelled wherever it is (epoch seconds; ``timeout=``); None: never.
    deadline_at: float | None = None

    @property
    def finished(self) -> bool:
        """True once the workflow reached a final status."""
        return Status(self.status).finished


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryMark:
    """What tells one state of a workflow's journal and signals from another, read without
    reading every entry: a final entry never changes as a run writes, so the journal a
    run wrote changed only if its count, its last seq or an open entry's (seq, status,
    attempt) did. An operator's resume rewrites entries (drops those from a seq on, makes
    a failed one retrying) and changes the workflow's ``updated_at``: read that with the
    mark, as the dashboard's stream does, to see every change. For pages that look again
    and again, at the cost of two index ranges."""

    entries: int
    last_seq: int | None
    #: (seq, status, attempt) of each entry in OPEN_ENTRY_STATUSES, in seq order.
    open: tuple[tuple[int, str, int], ...]
    signals: int


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """One change of owner: who took the workflow, when, and from whom."""

    workflow_id: str
    epoch: int
    owner: str
    claimed_at: float
    previous_owner: str | None
    reason: str  # "start", "recovery" (the owner died) or "resume" (the owner let go)


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """A running engine as other engines see it."""

    executor_id: str
    host: str
    pid: int
    pid_start: str
    started_at: float
    heartbeat_at: float
    #: The workflows it has the code of: (name, version, source hash).
    workflows: tuple[tuple[str, str | None, str | None], ...] = ()
    queues: tuple[str, ...] = ()  # the queues it serves

    def serves(self, name: str, version: str | None) -> bool:
        """Whether it has the code of workflow ``name`` at ``version``."""
        return any(n == name and v == version for n, v, _ in self.workflows)

    def source_hash_of(self, name: str, version: str | None) -> str | None:
        """The source hash of its code for workflow ``name`` at ``version``, if it has one."""
        for n, v, h in self.workflows:
            if n == name and v == version:
                return h
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Review:
    """A step whose outcome nothing could decide, waiting for a person."""

    workflow_id: str
    seq: int
    attempt: int
    step: str
    idempotency_key: str
    intent: str | None  # JSON: the arguments the step was called with
    reason: str
    opened_at: float
    decision: str | None = None  # "result", "retry" or "fail" once decided
    outcome: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
