"""Matching the code's durable calls against the journal (pure: no I/O, no clock).

The workflow is re-run from its first line; every durable call takes the next
seq in program order and asks the replayer what the journal holds there. A call
whose kind or name differs from the recorded one is a divergence: the replayer
raises :class:`~durably.errors.NonDeterminismError` and keeps raising it, so a
workflow that catches the first one still cannot go on.

The decisions about what an entry means are here too, as functions of their
arguments only (the time is an argument), so that they can be tested table by
table without a database: what a step's entry means for the call
(:func:`plan_step`, :func:`judge_reconcile`), how a signal wait or a join
ends (:func:`signal_outcome`, :func:`join_outcome`), and the journal edits
of an operator's ``resume`` and ``resolve`` (:func:`plan_reopen`,
:func:`resolved_entry`). The runners and the store verbs carry them out.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import json
from collections.abc import Iterable, Sequence

from durably import errors, journal, steps


class Replayer:
    """The journal of one workflow run, consumed seq by seq.

    ``recorded_code`` and ``asked_code`` name the code the workflow started
    under and today's (``version 3, source 1a2b...``), for the messages of a
    divergence; each replayed call's ``site`` (the file and line of the user's
    call, given to :meth:`note_site`) is named there too.
    """

    __slots__ = (
        "_diverged",
        "_entries",
        "_free",
        "_groups",
        "_last_seq",
        "_sites",
        "_top",
        "_twins",
        "_unmatched",
        "asked_code",
        "recorded_code",
        "workflow_id",
    )

    def __init__(
        self,
        workflow_id: str,
        entries: Iterable[journal.Entry],
        recorded_code: str | None = None,
        asked_code: str | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self._entries = {e.seq: e for e in entries}
        self._last_seq = 0
        self._diverged: errors.NonDeterminismError | None = None
        self._sites: dict[int, tuple[str, int]] = {}
        self.recorded_code = recorded_code
        self.asked_code = asked_code
        # A journal of tasks run at once is matched call by call (``_match``); one of a
        # single task, or begun before migration 0013 (its seq 1 follows nothing), is
        # consumed in seq order, as it was written.
        self._groups: dict[int, list[int]] | None = None
        self._unmatched: set[int] = set()
        self._free: list[int] = []
        self._top = 0
        self._twins: dict[tuple[int, str, str | None], set[int]] | None = None
        if self.begun_before_follows:
            return
        if tasks_ran_at_once(self._entries.values()):
            self._group()

    @property
    def diverged(self) -> errors.NonDeterminismError | None:
        """The divergence found so far, if any."""
        return self._diverged

    @property
    def last_seq(self) -> int:
        """The seq most recently handed out."""
        return self._last_seq

    def next_seq(
        self,
        follows: int = 0,
        kind: str = "",
        name: str = "",
        digest: str | None = None,
        *,
        new_task: bool = False,
        branch: bool = False,
    ) -> int:
        """Take the seq for the next durable call: the one after the last in program order,
        or, in a journal of several tasks, the recorded call this one is (``_match``).

        ``follows`` is the seq of the call the calling task made before this one (0: none);
        ``kind``, ``name`` and ``digest`` (a step's arguments, None: unknown) tell apart
        calls that followed the same one (the tasks an ``asyncio.gather`` began);
        ``new_task``: this is the first call of a task begun after ``follows``; ``branch``:
        the calling task is not the workflow function's own (its steps journal a twin).
        """
        if self._groups is None:
            self._last_seq += 1
        else:
            self._last_seq = self._match(follows, kind, name, digest, new_task, branch)
        return self._last_seq

    @property
    def begun_before_follows(self) -> bool:
        """Whether the journal was begun before migration 0013: its first entry follows
        nothing, where since 0013 seq 1 journals a 0 (and the first entry after a seq 1 a
        crash cut was, but for rare orders of calls, made after another task's call, so
        journals it). Its steps keep the keys they had then, by seq (``step_keys``)."""
        if not self._entries:
            return False
        return self._entries[min(self._entries)].follows is None

    def twins(self, follows: int, name: str, digest: str | None) -> set[int]:
        """Which of identical step calls (``journal.twin_of``) the journal recorded after
        the call at ``follows``: a new one of them is another (``step_keys``)."""
        if self._twins is None:
            self._twins = {}
            for seq, e in self._entries.items():
                if e.kind == journal.Kind.STEP:
                    base, twin = journal.twin_of(e.args_digest)
                    if twin:  # a branch's (the workflow's own calls are keyed by count)
                        key = (_followed(seq, e), e.name, base)
                        self._twins.setdefault(key, set()).add(twin)
        return self._twins.get((follows, name, digest), set())

    def holds_intents(self) -> bool:
        """Whether the journal holds a step's intent without its receipt (its outcome
        unknown: maybe awaiting a person's review), as read or as this run wrote it."""
        return any(
            e.kind == journal.Kind.STEP and e.status == _S.STARTED for e in self._entries.values()
        )

    @property
    def matching(self) -> bool:
        """Whether calls are matched to the journal's entries (tasks ran at once in it)."""
        return self._groups is not None

    def upcoming(
        self, follows: int, kind: str, name: str, *, new_task: bool = False
    ) -> journal.Entry | None:
        """The entry the calling task's next call of ``kind`` and ``name`` would replay,
        without taking it (``durably.patched()`` looks before it decides to call)."""
        if self._diverged is not None:
            raise self._diverged
        if self._groups is None:
            return self._entries.get(self._last_seq + 1)
        group = self._groups.get(follows)
        if not group:
            return None
        pick = self._pick(group, kind, name, None, new_task, self._hole(follows, group))
        return None if pick is None else self._entries[group[pick]]

    def awaits(self, kind: str, name: str) -> bool:
        """Whether, in a journal of several tasks, a recorded call of ``kind`` and ``name``
        is still to be matched (a ``patched()`` marker another task journaled)."""
        entries = self._entries
        return any(entries[s].kind == kind and entries[s].name == name for s in self._unmatched)

    def _group(self) -> None:
        """Index the journal by the call each entry followed in its task: the replay of
        tasks run at once takes them in another order than the first run did, and a
        call finds its own entry by what its task called before it, not by position."""
        groups: dict[int, list[int]] = {}
        for seq in sorted(self._entries):
            groups.setdefault(_followed(seq, self._entries[seq]), []).append(seq)
        self._groups = groups
        self._unmatched = set(self._entries)
        self._top = max(self._entries)
        # seqs the first run took for calls it never journaled (on their way at a crash)
        self._free = [seq for seq in range(1, self._top) if seq not in self._entries]

    def _match(
        self,
        follows: int,
        kind: str,
        name: str,
        digest: str | None,
        new_task: bool,
        branch: bool = False,
    ) -> int:
        """The seq of the call the calling task makes now, in a journal of several tasks.

        Among the recorded calls that followed the task's previous call (``_pick``): its
        own, or a seq never journaled that it keeps (it was on its way at a crash: so is
        its idempotency key). None recorded there: the first seq never journaled after
        the task's previous call, else one past every seq taken.
        """
        assert self._groups is not None
        group = self._groups.get(follows)
        if group:
            hole = self._hole(follows, group)
            pick = self._pick(group, kind, name, digest, new_task, hole, branch)
            if pick is not None:
                seq = group.pop(pick)
                self._unmatched.discard(seq)
                return seq
            if hole is not None:
                self._free.remove(hole)
                return hole
        free = self._free
        at = bisect.bisect_right(free, follows)
        if at < len(free):
            return free.pop(at)
        self._top += 1
        return self._top

    def _hole(self, follows: int, group: list[int]) -> int | None:
        """The first seq after ``follows`` the first run took and never journaled, if it
        lies before the last recorded call that followed it too (taken among them)."""
        free = self._free
        at = bisect.bisect_right(free, follows)
        return free[at] if at < len(free) and free[at] < group[-1] else None

    def _pick(
        self,
        group: list[int],
        kind: str,
        name: str,
        digest: str | None,
        new_task: bool,
        hole: int | None,
        branch: bool = False,
    ) -> int | None:
        """The index in ``group`` of the recorded call the code's call is; None: none is.

        The call of this kind, name and arguments (a step of the workflow function's own
        task, or of another: ``branch``), else a cancellation delivered there.
        Else a task's first call is none of them (they are its siblings', begun with it;
        it was on its way at a crash, or is new), and a later call of a task is a seq
        never journaled among them (``hole``) if there is one, else the call of this
        kind and name (other arguments: reported), else the first: its lookup reports
        the divergence, as in a workflow of one task.
        """
        entries = self._entries
        named = [
            i
            for i, seq in enumerate(group)
            if (entries[seq].kind, entries[seq].name) == (kind, name)
        ]
        if named:  # the arguments tell only between several, or against a sibling's or a hole
            decisive = len(named) > 1 or new_task or hole is not None
            asked = digest if decisive else None
            step = kind == journal.Kind.STEP
            for i in named:
                recorded, twin = journal.twin_of(entries[group[i]].args_digest)
                if step and (twin > 0) != branch:  # the workflow's own step, or a branch's
                    continue
                if asked is None or recorded is None or recorded == asked:
                    return i
        for i, seq in enumerate(group):  # a marker names the call it was delivered to
            marked = entries[seq]
            if marked.kind == journal.Kind.CANCEL and (
                not marked.name or marked.name == journal.describe_call(kind, name)
            ):
                return i
        if new_task or hole is not None:
            return None
        return named[0] if named else 0

    def replaying(self, seq: int) -> bool:
        """Whether the journal holds an entry at ``seq`` (the call there is replayed)."""
        return seq in self._entries

    def note_site(self, seq: int, site: tuple[str, int] | None) -> None:
        """Remember where the code's call at ``seq`` was made (file, line), for the messages
        about it; kept as a pair and written as text only when a message needs it."""
        if site is not None:
            self._sites[seq] = site

    def site(self, seq: int) -> str | None:
        """``file:line`` of the code's call at ``seq``, when it was replayed and known."""
        site = self._sites.get(seq)
        return None if site is None else f"{site[0]}:{site[1]}"

    def peek(self, seq: int) -> journal.Entry | None:
        """The entry at ``seq``, without checking it against any call."""
        if self._diverged is not None:
            raise self._diverged
        return self._entries.get(seq)

    def mismatch(
        self, seq: int, recorded: str | None, asked: str | None
    ) -> errors.NonDeterminismError:
        """The divergence at ``seq`` (the recorded call, the code's), naming the line of the
        code's call and the code of both sides; kept like any (:meth:`diverge`)."""
        return self.diverge(
            errors.NonDeterminismError(
                self.workflow_id,
                seq,
                recorded,
                asked,
                self.site(seq),
                self.recorded_code,
                self.asked_code,
            )
        )

    def arguments_changed(self, seq: int, entry: journal.Entry) -> errors.ArgumentsChanged:
        """The error (or warning text) for a replayed step called with other arguments."""
        return errors.ArgumentsChanged(
            self.workflow_id,
            seq,
            f"arguments digest {entry.args_digest}",
            entry.describe(),
            self.site(seq),
            self.recorded_code,
            self.asked_code,
        )

    def lookup(self, seq: int, kind: str, name: str) -> journal.Entry | None:
        """What the journal holds at ``seq`` for this call, or None when it is new.

        Raises NonDeterminismError when the journal recorded another call there.
        A ``cancel`` entry is returned whatever was asked: the caller raises
        Cancelled there, as the first run did.
        """
        if self._diverged is not None:
            raise self._diverged
        entry = self._entries.get(seq)
        if entry is None or entry.kind == journal.Kind.CANCEL:
            return entry  # a cancellation delivered here stands in for any call
        if entry.kind != kind or entry.name != name:
            raise self.mismatch(seq, entry.describe(), journal.describe_call(kind, name))
        return entry

    def diverge(self, error: errors.NonDeterminismError) -> errors.NonDeterminismError:
        """Stop here with ``error`` (a recorded value the code cannot take); kept and
        raised again by every later call, like a divergence found by ``lookup``."""
        if self._diverged is None:
            self._diverged = error
        return self._diverged

    def record(self, entry: journal.Entry) -> None:
        """Remember an entry this run has just committed."""
        self._entries[entry.seq] = entry

    def check_finished(self) -> None:
        """Raise NonDeterminismError if the journal holds calls the code never made."""
        if self._diverged is not None:
            raise self._diverged
        if self._groups is not None:
            beyond = list(self._unmatched)
        else:
            beyond = [seq for seq in self._entries if seq > self._last_seq]
        if beyond:
            entry = self._entries[min(beyond)]
            raise self.mismatch(entry.seq, entry.describe(), None)


def code_label(version: str | None, source_hash: str | None) -> str | None:
    """The code a workflow ran under as messages name it: ``version 3, source 1a2b3c4d``."""
    parts = []
    if version is not None:
        parts.append(f"version {version}")
    if source_hash is not None:
        parts.append(f"source {source_hash}")
    return ", ".join(parts) or None


# --- patches --------------------------------------------------------------------------


class Patch(enum.Enum):
    """What ``durably.patched(change_id)`` finds at the next seq."""

    MARKED = "marked"  # the marker of this change: the workflow took the new path here
    PASSED = "passed"  # another call: old code went past this point (no seq is taken)
    NEW = "new"  # nothing: the workflow reaches this point now, under the new code


def plan_patch(entry: journal.Entry | None, change_id: str) -> Patch:
    """What the entry at the next seq means for ``patched(change_id)``.

    The marker of this change means the new path was taken (and the marker's
    seq is consumed); any other entry means the workflow went past this point
    under code without the patch, which recorded its next call here (no seq is
    taken, so that call replays as before); nothing recorded means the workflow
    reaches this point now, and takes the new path.
    """
    if entry is None:
        return Patch.NEW
    if entry.kind == journal.Kind.PATCH and entry.name == change_id:
        return Patch.MARKED
    return Patch.PASSED


# --- what a step's entry means for the call -------------------------------------------


class Action(enum.Enum):
    """What a step call does with the journal's entry at its seq."""

    RETURN = "return"  # the receipt: return its result
    RAISE = "raise"  # a final failure: raise the recorded error
    BACKOFF = "backoff"  # a failed attempt whose retry is due at wake_at: wait, then run
    RECONCILE = "reconcile"  # an intent without a receipt, a reconcile= step: ask outside
    REVIEW = "review"  # an intent without a receipt, nothing can decide: ask a person
    RUN = "run"  # run the function (attempt ``attempt``)


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlan:
    """The decision for one step call: the action, and the attempt a run would be."""

    action: Action
    attempt: int = 1  # the attempt to run (after a back-off, or a reconcile that found nothing)
    wake_at: float | None = None  # BACKOFF: when the next attempt is due


_RUN_FIRST = StepPlan(Action.RUN)
_RETURN = StepPlan(Action.RETURN)
_RAISE = StepPlan(Action.RAISE)

_S = journal.EntryStatus


def plan_step(entry: journal.Entry | None, *, reconciles: bool) -> StepPlan:
    """What the step's entry (None: the call is new) means for this call.

    A receipt is returned and a final error raised, on every replay. A failed
    attempt with a retry due runs the next attempt, after waiting out its
    back-off (the time is in the journal). An intent without a receipt means
    the outcome is unknown: a step with ``reconcile=`` asks the outside world,
    any other (an ``at_most_once`` step) waits for a person. A step's entry is
    never ``timed_out``; one that were would be run as new, as it always was.
    """
    if entry is None:
        return _RUN_FIRST
    status = entry.status
    if status == _S.COMPLETED:
        return _RETURN
    if status == _S.FAILED:
        return _RAISE
    if status == _S.RETRYING:
        if entry.wake_at is None:
            return StepPlan(Action.RUN, entry.attempt + 1)
        return StepPlan(Action.BACKOFF, entry.attempt + 1, entry.wake_at)
    if status == _S.STARTED:
        action = Action.RECONCILE if reconciles else Action.REVIEW
        return StepPlan(action, entry.attempt + 1)
    return _RUN_FIRST


#: Why an interrupted at-most-once step waits for a person.
AT_MOST_ONCE_REASON = "an at-most-once step was interrupted; its outcome is unknown"


def judge_reconcile(verdict: object, raised: BaseException | None = None) -> tuple[Action, str]:
    """What a reconcile function's answer means: the action and the reason to record.

    ``Found(result)``: RETURN (commit that result as the receipt); ``NotFound``:
    RUN the step again; ``Unknown``, an exception (``raised``) or anything else:
    REVIEW, with a reason a person can act on.
    """
    if raised is not None:
        return Action.REVIEW, f"reconcile raised {type(raised).__name__}: {raised}"
    reason = f"reconcile answered {verdict!r}"
    if isinstance(verdict, steps.Found):
        return Action.RETURN, reason
    if verdict is steps.NotFound:
        return Action.RUN, reason
    if verdict is steps.Unknown:
        return Action.REVIEW, reason
    return Action.REVIEW, f"reconcile returned {verdict!r}, not Found(...), NotFound or Unknown"


# --- how a wait ends --------------------------------------------------------------------


def parked_signal_wait(history: Sequence[journal.Entry]) -> journal.Entry | None:
    """The signal wait a parked workflow is held at, when it is all it waits for.

    That is the journal's last entry, a signal wait still started, with every other
    entry final: a re-run of the workflow reaches that wait and nothing else open.
    None otherwise (a sleep, a child, several waits at once, a step's open intent).
    """
    if not history:
        return None
    last = history[-1]
    if last.kind != journal.Kind.SIGNAL or last.status != _S.STARTED:
        return None
    if any(e.status not in journal.FINAL_ENTRY_STATUSES for e in history[:-1]):
        return None
    return last


def signal_outcome(wait: journal.Entry, signal: str | None, now: float) -> journal.Entry:
    """The signal wait's entry after a look at the mailbox.

    ``signal`` is the payload of the oldest signal of that name not yet
    consumed (None: there is none). A signal completes the wait even past its
    deadline; without one, a wait whose deadline passed is ``timed_out``;
    otherwise it goes on waiting (returned as it is).
    """
    if signal is not None:
        return dataclasses.replace(wait, status=_S.COMPLETED, payload=signal, finished_at=now)
    if wait.wake_at is not None and now >= wait.wake_at:
        return dataclasses.replace(wait, status=_S.TIMED_OUT, finished_at=now)
    return wait


def sent_outcome(send: journal.Entry, error: str | None, now: float) -> journal.Entry:
    """A workflow's signal send after the store took it: completed, or failed with
    ``error`` (the JSON of why the target could not keep it), final either way."""
    if error is None:
        return dataclasses.replace(send, status=_S.COMPLETED, finished_at=now)
    return dataclasses.replace(send, status=_S.FAILED, payload=error, finished_at=now)


def join_outcome(
    wait: journal.Entry, child: journal.WorkflowInfo | None, now: float
) -> journal.Entry:
    """The join's entry given the child's row: completed with the child's outcome
    once the child finished (whatever its status), else still waiting."""
    if child is None or not child.finished:
        return wait
    result = {"status": child.status, "output": child.output, "error": child.error}
    return dataclasses.replace(
        wait,
        status=_S.COMPLETED,
        payload=json.dumps(result, separators=(",", ":")),
        finished_at=now,
    )


# --- the journal edits of operator verbs ------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Reopening:
    """The journal edit that resumes a finished workflow."""

    delete_from: int | None = None  # drop the entries from this seq on (a cancellation)
    retry_seq: int | None = None  # make the failed step at this seq retry at once


_REOPENABLE = frozenset({journal.Status.FAILED, journal.Status.CANCELLED, journal.Status.DIVERGED})


def plan_reopen(workflow_id: str, status: str, history: Sequence[journal.Entry]) -> Reopening:
    """How ``resume`` edits the journal of a workflow that ended ``status``.

    A cancelled workflow continues from where its cancellation stopped it (its
    entries from the cancel marker on are dropped), unless steps completed
    after it (cleanup, compensations): resuming would forget them. A failed
    workflow gives the step that failed it another try. A diverged workflow
    replays its whole journal: a cancellation it had received before it diverged
    stays delivered where it was. Only a failed, cancelled or diverged workflow
    can be resumed.
    """
    if status not in _REOPENABLE:
        raise errors.NotResumable(
            f"workflow {workflow_id!r} is {status}; only a failed, cancelled or "
            "diverged workflow, or a pending one waiting on its queue, can be resumed"
        )
    if status == journal.Status.DIVERGED:
        return Reopening()
    cancels = [e.seq for e in history if e.kind == journal.Kind.CANCEL]
    if cancels:  # continue from where the cancellation stopped it
        after = [
            e
            for e in history
            if e.seq > min(cancels) and e.kind == journal.Kind.STEP and e.status == _S.COMPLETED
        ]
        if after:
            raise errors.NotResumable(
                f"workflow {workflow_id!r} ran {len(after)} step(s) after its cancellation "
                f"(cleanup or compensations, e.g. {after[0].name!r} at seq {after[0].seq}); "
                "resuming would forget them: fork it instead"
            )
        _check_tasks_after(workflow_id, min(cancels), history)
        return Reopening(delete_from=min(cancels))
    if status == journal.Status.FAILED:
        failed = [e.seq for e in history if e.kind == journal.Kind.STEP and e.status == _S.FAILED]
        if failed:  # give the step that failed the workflow another try
            return Reopening(retry_seq=max(failed))
    return Reopening()


def tasks_ran_at_once(entries: Iterable[journal.Entry]) -> bool:
    """Whether a journal holds calls of several tasks: an entry that followed another
    call than the one before it (seq 1's 0 marks only how the journal was written)."""
    return any(e.follows is not None and e.seq != 1 for e in entries)


def _followed(seq: int, entry: journal.Entry) -> int:
    """The seq of the call the entry at ``seq`` followed in its task."""
    return seq - 1 if entry.follows is None else entry.follows


def _check_tasks_after(workflow_id: str, cancel: int, history: Sequence[journal.Entry]) -> None:
    """Refuse to resume a workflow whose tasks ran at once when, after its cancellation,
    another task's entry records what dropping it would repeat: a step it tried, a child
    it started or a signal it sent (made again under another seq, so another id and
    key). A signal it received goes back to the queue with the dropped entries
    (``reopen``), to be received again. In a workflow of one task every entry after the
    marker is its cleanup's."""
    if not tasks_ran_at_once(history):
        return
    for e in history:
        if e.seq <= cancel or e.kind not in _KEPT_AFTER:
            continue
        raise errors.NotResumable(
            f"workflow {workflow_id!r} ran tasks at once, and after its cancellation (seq "
            f"{cancel}) one of them recorded {e.describe()} at seq {e.seq} ({e.status}): "
            "resuming would drop it, and the task would wait for, or do, it again"
        )


#: What a task run at once may have recorded after another's cancellation that a resume
#: must not drop (``_check_tasks_after``).
_KEPT_AFTER = frozenset({journal.Kind.STEP, journal.Kind.CHILD, journal.Kind.SEND})


#: The entry status each decision of a review writes at the step's seq.
_DECIDED = {"result": _S.COMPLETED, "retry": _S.RETRYING, "fail": _S.FAILED}


def resolved_entry(
    review: journal.Review, decision: str, outcome: str | None, now: float
) -> journal.Entry:
    """The step's entry after a person's decision on its review.

    ``result``: the receipt holding ``outcome``; ``fail``: a final failure
    holding ``outcome`` (the error); ``retry``: an attempt due now, keeping
    the intent's arguments, so the step runs again with the same key.
    """
    retry = decision == "retry"
    return journal.Entry(
        review.seq,
        journal.Kind.STEP,
        review.step,
        _DECIDED[decision],
        review.attempt,
        review.intent if retry else outcome,
        review.opened_at,
        now,
        now if retry else None,
    )
