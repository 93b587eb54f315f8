"""One run of one workflow: the commit protocol of its durable calls.

A :class:`Run` is created by the engine each time it (re)starts a workflow from
its first line. Workflow-side calls reach it through ``context.current_run``.
For a step it follows DESIGN.md's protocol: look the call up in the journal;
if it is new, run the function and commit the receipt, fenced by the lease
epoch, in one transaction, and only then return to the workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import sys
import types
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from durably import (
    cancellation,
    codec,
    errors,
    faults,
    journal,
    parking,
    replay,
    runstate,
    step_keys,
)
from durably.run_types import (
    REVIEW,
    Abandoned,
    Block,
    Compensation,
    Outcome,
    Services,
    Suspended,
)
from durably.step_threads import StepThreads
from durably.storage import thread

if TYPE_CHECKING:
    from durably.steps import StepDefinition

T = TypeVar("T")

#: The fenced store verbs a run writes with (see ``Run.write``).
Verb = Literal[
    "append_entries",
    "finish_workflow",
    "finish_closing_reviews",
    "park",
    "open_review",
    "start_child",
    "receive_signal",
    "join_child",
    "post_signal",
    "read_event",
    "commit_receipt",
    "decide_race",
]

#: Where each verb takes the batch of entries, counted in the arguments after the epoch.
_BATCH_AT: dict[str, int] = {
    "append_entries": 0,
    "finish_workflow": 3,  # status, output, error, entries
    "finish_closing_reviews": 3,  # as finish_workflow
    "park": 2,  # status, wake_at, entries, signals, children
    "open_review": 3,  # intent, idempotency_key, reason, entries
    "start_child": 0,  # entries, child
    "receive_signal": 1,  # wait, entries
    "join_child": 1,  # wait, entries
    "post_signal": 1,  # send, entries, target, name, payload
    "read_event": 1,  # wait, entries, source, key
    "commit_receipt": 0,  # entries, events
    "decide_race": 0,  # entries, losers
}

log = logging.getLogger("durably")

State = runstate.State
Cancellation = runstate.Cancellation
_HOLDING = runstate.HOLDING

__all__ = ["REVIEW", "Abandoned", "Block", "Compensation", "Run", "Services", "Suspended"]

#: Transient store errors a commit waits out before giving the run up.
_TRANSIENT = (errors.DatabaseLocked, errors.DatabaseUnavailable)

#: The first and the longest pause between two tries of a write refused for lack of room.
_FULL_DELAYS = (0.25, 10.0)


class Run(parking.Parking):
    """The state of one workflow run: its journal, its lease epoch, unflushed values.

    Workflow-side modules (steps, waits, agents, approvals) use only this
    declared interface, never the run's store, journal or pending list:

    * ``take_seq()`` and ``lookup(seq, kind, name)``: the seq of a durable call
      and what the journal holds there; ``cancel_point(seq, kind, name)`` delivers a
      requested cancellation;
    * ``stage(entry)``: journal an entry that rides with the next write;
    * ``write(verb, ...)``: the one write path: the staged entries go with one
      fenced store verb, in one transaction, and are then part of the journal;
      ``commit(*entries)`` and ``finish(...)`` are the two common verbs;
    * ``clock()``, ``step_threads``, ``child_started(id)``, ``signal_sent(id, name)``:
      what the engine lends;
    * ``local(key, factory)``: a value kept for this run only (agents' tallies);
    * ``block``, ``poke``, ``active``, ``not_active``, ``ready``: waiting and parking;
    * ``patched(id)``, ``deprecate_patch(id)``: a change's path, journaled as a marker;
      ``check_arguments(seq, entry, digest)``: a replayed step's arguments, reported
      through ``warn`` (the one write outside ``write``: unfenced, information only).
    """

    def __init__(
        self,
        services: Services,
        info: journal.WorkflowInfo,
        history: list[journal.Entry],
        version: str | None = None,
        source_hash: str | None = None,
    ) -> None:
        """``version`` and ``source_hash``: today's code, named in divergence messages."""
        self._services = services
        #: The engine's clock (seconds since the epoch), lent to workflow-side modules.
        self.clock: Callable[[], float] = services.clock
        self.workflow_id = info.workflow_id
        self._name = info.name
        self._epoch = info.epoch
        self._replayer = replay.Replayer(
            info.workflow_id,
            history,
            replay.code_label(info.version, info.source_hash),
            replay.code_label(version, source_hash),
        )
        self._patches: dict[str, bool] = {}  # durably.patched() answers, once per change id
        # The seq of the calling task's last durable call (its context's, inherited by the
        # tasks it starts), and each call's where that was not seq - 1, until journaled.
        self._after = contextvars.ContextVar[int]("durably_after", default=0)
        self._follows: dict[int, int] = {}
        # A replay that matches calls (``Replayer``) also knows which task made the last
        # call, by its id (0: none bound, as in tests that drive a Run without a task):
        # holding the task would make a cycle (task, context, value) only the cyclic
        # collector frees. Ids of tasks alive at once differ, and a task sees its own
        # value or its creator's, alive when it was created.
        self._matching = self._replayer.matching
        self._caller = contextvars.ContextVar[int]("durably_caller", default=0)
        self._keys = step_keys.StepKeys(info.workflow_id, self._replayer)
        # (the calling task's last call when it last registered an undo, how many it has
        # registered since that call): ``undo_order``
        self._undos = contextvars.ContextVar[tuple[int, int]]("durably_undos", default=(0, 0))
        self.parent_id = info.parent_id
        self.reviewing = False  # a step of this run opened a review (``finish`` closes it)
        self._pending: list[journal.Entry] = []  # journaled values not yet committed
        # Writes on their way that carry values a step could observe (now, random, uuid4),
        # and what is set once none is: a step waits for them (``flush_observed``).
        self._observing = 0
        self._observed = asyncio.Event()
        #: The seq of a signal wait the claim's commit received (``take_woken``): final in
        #: ``history``, but it ends in this run, which emits its span.
        self.received_at_claim: int | None = None
        self.ended: Outcome | None = None  # the workflow's end, once this run committed it
        self._locals: dict[object, Any] = {}
        self._state = State.RUNNING
        self._resume = State.RUNNING  # where PARKING goes back to if the park does not happen
        self._lost: errors.FencedError | None = None  # why LOST
        self._abandoned: errors.StoreError | None = None  # why ABANDONED
        # A replay meets the journaled cancellation at its own seq; never earlier.
        self.cancellation = Cancellation(
            requested=cancellation.asked(info.cancel_requested, info.deadline_at, self.clock()),
            in_journal=any(e.kind == journal.Kind.CANCEL for e in history),
            deadline=info.deadline_at,
        )
        self.inflight = 0  # steps running and commits on their way
        self.suspended = False  # a Suspended was raised into the workflow's code
        # the driver running compensations, weakly: its context holds this run
        self._compensator: weakref.ref[asyncio.Task[Any]] | None = None
        self._blocks: list[Block] = []
        self.pokes = 0  # wake-ups so far (``poke``): a wait that looked before one re-checks
        self.compensations: list[Compensation] = []
        self._park_timer: asyncio.TimerHandle | None = None
        self._park_task: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # set whenever no park is on its way
        self._settled.set()
        self._idle = asyncio.Event()
        self._idle.set()

    # --- what the engine lends ---------------------------------------------------

    @property
    def epoch(self) -> int:
        """The lease epoch this run writes under (the fence of every write)."""
        return self._epoch

    @property
    def step_threads(self) -> StepThreads:
        """The pool that runs sync step functions."""
        return self._services.step_threads

    def loop_is_quiet(self) -> bool:
        """True when this run may hold the event loop's thread for a moment: inline
        commits are allowed and no other callback waits to run on the loop."""
        return self._services.inline_commits and thread.loop_is_quiet()

    def child_started(self, child_id: str) -> None:
        """Tell the engine a child workflow was committed, so it can run it at once."""
        self._services.on_child(child_id)

    def signal_sent(self, workflow_id: str, name: str) -> None:
        """Tell the engine this run committed signal ``name`` to ``workflow_id``, so that a
        run of it waiting in this process looks at once."""
        self._services.on_signal(workflow_id, name)

    def events_published(self, keys: Iterable[str]) -> None:
        """Tell the engine this run committed the events ``keys``, so that a run waiting
        for one in ``get_event`` in this process (or parked: due now) reads it at once."""
        for key in keys:
            self._services.on_event(self.workflow_id, key)

    def local(self, key: object, factory: Callable[[], T]) -> T:
        """The value kept under ``key`` for this run only, made by ``factory`` on first use.

        For side tables of workflow-side modules (an agent's usage tally, the
        approvals of a run): they live and die with the run, and a replay starts
        them afresh.
        """
        try:
            value: T = self._locals[key]
        except KeyError:
            value = self._locals[key] = factory()
        return value

    # --- the one write path ---------------------------------------------------

    def stage(self, entry: journal.Entry) -> None:
        """Journal ``entry`` now; it is committed with this run's next write."""
        self._pending.append(entry)
        self._replayer.record(entry)

    async def write(
        self, verb: Verb, *args: Any, entries: Sequence[journal.Entry] = (), internal: bool = False
    ) -> Any:
        """Call the store's ``verb`` with the staged entries and ``entries``, fenced.

        Every store verb a run writes with takes ``(workflow_id, epoch, ...,
        now)`` and the batch of entries at its own place among ``args``
        (``_BATCH_AT``); the batch is the staged entries followed by
        ``entries``. Once the verb returns, the batch (and an entry the verb
        returns: a wait's outcome) is part of this run's journal.

        The verb runs on the store thread, waiting out a locked database a
        while. It counts as activity: a run never parks while a write is on its
        way, and none starts while a park is on its way (it waits to see
        whether the run parked), except the run's own park and final write
        (``internal``). A database that keeps failing abandons the run
        (``Abandoned``). A full database is waited out longer, with a growing
        pause and a loud log line each time: the write holds a step's outcome
        that running the step again would only repeat. A value the database
        refuses (``StorageDataError``) is raised as it is: the run goes on, and
        the caller records the refusal instead.
        """
        batch = [*self._take_pending(), *entries]
        if self._follows:  # tasks ran at once: each entry says which call it followed
            batch = [self._with_follows(e) for e in batch]
            args = tuple(self._with_follows(a) if isinstance(a, journal.Entry) else a for a in args)
        observed = any(e.kind in _OBSERVABLE for e in batch)
        if observed:
            self._observing += 1
        try:
            return await self._write(verb, batch, args, internal)
        finally:
            if observed:
                self._observing -= 1
                if not self._observing:  # wake the steps waiting, then wait anew
                    self._observed.set()
                    self._observed = asyncio.Event()

    async def _write(
        self, verb: Verb, batch: list[journal.Entry], args: tuple[Any, ...], internal: bool
    ) -> Any:
        """``write`` once the batch is taken."""
        fn = getattr(self._services.store.store, verb)
        at = _BATCH_AT[verb]
        if at == 0:  # a step's commit: no slicing on the hot path
            head = (self.workflow_id, self._epoch, batch, *args)
        else:
            head = (self.workflow_id, self._epoch, *args[:at], batch, *args[at:])
        if not internal and not self.ready_now():  # its own park and final write skip it
            await self.ready()
        delay, waited = 0.05, 0.0
        full_delay, full_waited = _FULL_DELAYS[0], 0.0
        services = self._services
        with self.active():
            while True:
                try:
                    # the verb itself, not a function around it: PostgreSQL sends a plain
                    # step's commit without BEGIN and COMMIT only for a verb called as itself
                    result = await services.store.call(
                        fn, *head, services.clock(), inline=services.inline_commits
                    )
                    break
                except errors.FencedError as exc:
                    self.lose(exc)
                    raise
                except errors.StorageDataError:
                    raise
                except errors.StorageFull as exc:
                    if full_waited >= services.full_patience:
                        raise self._abandon(exc) from exc
                    log.error(
                        "workflow %s cannot commit: %s: %s; trying again in %.2g s "
                        "(%.0f s of %.0f s waited)",
                        self.workflow_id,
                        type(exc).__name__,
                        exc,
                        full_delay,
                        full_waited,
                        services.full_patience,
                    )
                    if await self._pause(full_delay):
                        raise self._abandon(exc) from exc
                    full_waited += full_delay
                    full_delay = min(full_delay * 2, _FULL_DELAYS[1])
                except _TRANSIENT as exc:
                    if waited >= services.commit_patience:
                        raise self._abandon(exc) from exc
                    await asyncio.sleep(delay)
                    waited += delay
                    delay = min(delay * 2, 2.0)
                except errors.StoreError as exc:
                    raise self._abandon(exc) from exc
        for entry in batch:
            self._replayer.record(entry)
            if entry.kind == _EVENT:  # set_event in workflow code: committed now
                self._services.on_event(self.workflow_id, entry.name)
        if self._follows:  # journaled with their entries now: a later write keeps them
            for written in (*batch, *args):
                if isinstance(written, journal.Entry):
                    self._follows.pop(written.seq, None)
        if isinstance(result, journal.Entry):
            self._replayer.record(result)
        if verb in _COMMITS:  # a commit: durable now (durably test-crashes counts)
            faults.committed(self.workflow_id, batch)
        return result

    async def commit(
        self,
        *entries: journal.Entry,
        events: Sequence[tuple[str, str]] = (),
        given_back: Sequence[tuple[int, str]] = (),
    ) -> None:
        """Commit entries (and any staged ones) fenced by this run's epoch.

        ``events`` (``(key, value JSON)`` pairs a step set) are published in the
        same transaction, at the seq of the last entry (the step's receipt).
        ``given_back`` (``(seq, name)`` of the signal waits a race's outcome drops) gives
        back, in the same transaction, the signals those waits took, and drops their
        entries (``decide_race``); this run's waits for those signals look again.
        """
        if events:
            requested = await self.write("commit_receipt", events, entries=entries)
        elif given_back:
            requested = await self.write("decide_race", given_back, entries=entries)
            for _, name in given_back:
                self.poke(journal.Kind.SIGNAL, name)
        else:
            requested = await self.write("append_entries", entries=entries)
        if requested:
            self.cancellation.requested = True

    async def finish(self, status: str, output: str | None, error: str | None) -> None:
        """Commit the final status with any staged entries; ``ended`` then holds it (the
        status and error as recorded: a late cancel records ``cancelled``)."""
        await self.settle()
        # a branch's review left undecided is closed in the same transaction
        undecided = self.reviewing or self._replayer.holds_intents()
        verb: Verb = "finish_closing_reviews" if undecided else "finish_workflow"
        status, error = await self.write(verb, status, output, error, internal=True)
        faults.reached("after_finish", self._name)
        self.ended = Outcome(status, output, error)

    def _with_follows(self, entry: journal.Entry) -> journal.Entry:
        """``entry`` with the seq of the call its task made before it, where not seq - 1."""
        follows = self._follows.get(entry.seq)
        if follows is None or entry.follows == follows:
            return entry
        return dataclasses.replace(entry, follows=follows)

    def _take_pending(self) -> list[journal.Entry]:
        """Hand over the staged entries to the write about to be made."""
        batch, self._pending = self._pending, []
        return batch

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less if the engine starts stopping; True if it did."""
        stopping = self._services.stopping
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stopping.wait()
        return stopping.is_set()

    def _abandon(self, exc: errors.StoreError) -> Abandoned:
        self._abandoned = exc
        if self._state in _HOLDING:
            self._state = State.ABANDONED
        return Abandoned(f"workflow {self.workflow_id!r}: the database failed: {exc}")

    def suspend(self, why: str) -> Suspended:
        """The Suspended to raise into workflow code, remembered: code that swallows it
        (``gather(..., return_exceptions=True)``) must not get its result committed."""
        self.suspended = True
        return Suspended(why)

    async def settle(self) -> None:
        """Wait until no park is on its way (it either parked the run or did not)."""
        await self._settled.wait()

    def ready_now(self) -> bool:
        """``ready()`` without a coroutine when no park is on its way (the usual case):
        True once the liveness check passed; False when ``ready()`` must be awaited."""
        if self._settled.is_set():
            self._check_live()
            return True
        return False

    async def ready(self) -> None:
        """Wait out a park on its way; raise if the run let go of the workflow."""
        while not self._settled.is_set():
            await self._settled.wait()
        self._check_live()

    # --- the run's state ---------------------------------------------------------

    @property
    def state(self) -> State:
        """Where this run is in its life (see :class:`State`)."""
        return self._state

    @property
    def let_go(self) -> bool:
        """True once this run holds the workflow no more: ended, parked, lost or abandoned."""
        return self._state not in _HOLDING

    @property
    def parked(self) -> bool:
        """True once a park of this run reached the store (or could write nothing more)."""
        return self._state is State.PARKED

    @property
    def listening(self) -> bool:
        """True while a wake-up (a signal, a child, a cancellation) can still reach the run:
        neither parked nor retired."""
        return self._state not in (State.PARKED, State.RETIRED)

    @property
    def closing(self) -> bool:
        """True once the workflow function ended: no new durable call may start."""
        return self._state is State.CLOSING or (
            self._state is State.PARKING and self._resume is State.CLOSING
        )

    @property
    def _parking(self) -> bool:
        """True while a park is on its way (from any state)."""
        return not self._settled.is_set()

    def lose(self, fenced: errors.FencedError) -> None:
        """Another executor holds the workflow now: every later call of this run raises it."""
        self._lost = fenced
        if self._state in _HOLDING:
            self._state = State.LOST

    def _check_live(self) -> None:
        """The one liveness check: raise unless this run still holds its workflow."""
        if self._state in _HOLDING:
            return
        if self._lost is not None:
            raise self._lost
        if self._abandoned is not None:
            raise Abandoned(str(self._abandoned))
        raise self.suspend("this run has let go of the workflow")

    def must_flush(self) -> bool:
        """True when journaled values a step could observe (now, random, uuid4) are staged,
        or on their way in a write not yet committed: they are committed before the step
        runs (``flush_observed``).

        Other pending entries (events, finished sleeps) ride with the step's
        receipt, so a plain step still costs one commit.
        """
        return bool(self._observing) or self._observable_staged()

    async def flush_observed(self) -> None:
        """Commit the staged values a step could observe, and wait for the writes already
        carrying such values: a step of a ``gather`` that starts while another step's
        commit of them is on its way must not run before they are durable (killed
        before that commit, the next run would make new values, and the step would run
        again on other inputs)."""
        if self._observable_staged():
            await self.commit()
        while self._observing:
            await self._observed.wait()

    def _observable_staged(self) -> bool:
        return bool(self._pending) and any(e.kind in _OBSERVABLE for e in self._pending)

    # --- journaled values -------------------------------------------------------

    def journal_value(self, kind: journal.Kind, make: Callable[[], T]) -> T:
        """Return the recorded value at the next seq, or make, record and return a new one."""
        seq = self.take_seq(kind=kind)
        entry = self.lookup(seq, kind, "")
        if entry is not None:
            return codec.decode(entry.payload or "null", where=f"{kind} at seq {seq}")  # type: ignore[return-value]
        value = make()
        now = self._services.clock()
        payload = codec.encode(value, where=f"durably.{kind}() at seq {seq}")
        self.stage(journal.Entry(seq, kind, "", _COMPLETED, 1, payload, now, now))
        return value

    # --- steps --------------------------------------------------------------------

    def call_step(
        self, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Coroutine[Any, Any, Any]:
        """Take the step's seq and key now, in program order, and return the awaitable
        that runs it."""
        after = self._after.get()
        digest = step_keys.args_digest(args, kwargs)
        if digest is None and not self._keys.own():  # a branch's key needs its arguments
            digest = step_keys.partial_digest(args, kwargs)
        # the user's call is two frames up: StepFunction.__call__, then its caller
        seq = self.take_seq(callers=2, kind=_STEP, name=step.name, digest=digest)
        key, recorded = self._keys.key(seq, after, step.name, digest)
        return _run_step()(self, seq, step, args, kwargs, recorded, key)

    def check_stopping(self) -> None:
        """Raise Suspended when no new step may start: the engine or the workflow is ending."""
        if self._services.stopping.is_set():
            raise self.suspend("engine stopping")
        if self.closing and not self._is_compensating():
            raise _ended()

    def compensate_here(self) -> None:
        """From now on only the calling task (the driver running compensations) may go on."""
        task = asyncio.current_task()
        self._compensator = None if task is None else weakref.ref(task)

    def _is_compensating(self) -> bool:
        compensator = self._compensator
        return compensator is not None and asyncio.current_task() is compensator()

    # --- seqs, cancellation ---------------------------------------------------------

    @property
    def diverged(self) -> errors.NonDeterminismError | None:
        """The divergence from the journal found so far, if any."""
        return self._replayer.diverged

    @property
    def last_seq(self) -> int:
        """The seq most recently taken."""
        return self._replayer.last_seq

    def diverge(self, error: errors.NonDeterminismError) -> errors.NonDeterminismError:
        """Mark the run diverged with ``error`` (the first one wins); returned to be raised."""
        return self._replayer.diverge(error)

    def recorded(self, seq: int, kind: str, name: str) -> journal.Entry | None:
        """What the journal holds at ``seq`` for this call, without delivering a cancellation.

        A look ahead for code that must know now whether a call it has made
        will be replayed (a sub-agent's join); the call itself still meets its
        entry through ``lookup``. Raises NonDeterminismError on another call.
        """
        return self._replayer.lookup(seq, kind, name)

    def check_finished(self) -> None:
        """Raise NonDeterminismError if the journal holds calls the code never made."""
        self._replayer.check_finished()

    def undo_order(self) -> tuple[int, int]:
        """Where an undo registered now runs among the others (newest first): after the
        calling task's last durable call, as the n-th it registered since. Tasks started
        together tie (they inherit their starter's count), and their undos then sort by
        what they are: registration order among them differs on a replay."""
        after = self._after.get()
        since, count = self._undos.get()
        order = (after, count + 1 if since == after else 1)
        self._undos.set(order)
        return order

    def bind_task(self) -> None:
        """The calling task runs the workflow function: the tasks it starts are new tasks
        to a replay (``Replayer``), its own later calls not, and their steps are keyed
        by what they are (``step_keys``)."""
        self._caller.set(id(asyncio.current_task()))
        self._keys.bind()

    def take_seq(
        self,
        *,
        callers: int = 0,
        kind: str = "",
        name: str = "",
        digest: str | None = None,
    ) -> int:
        """The next seq, for a durable call made now; refuses once the run cannot go on.

        ``callers``: how many of durably's frames the caller knows lie between it and
        the user's call, skipped unread when a replayed call's line is noted. ``kind``,
        ``name`` and a step's arguments' ``digest`` tell a replay of tasks run at once which
        recorded call this is, where several followed the same call (``Replayer``).
        """
        if self._replayer.diverged is not None:
            raise self._replayer.diverged
        self._check_live()
        if self.closing and not self._is_compensating():
            raise _ended()
        after = self._after.get()
        self._keys.count()
        if self._matching:
            seq = self._match(after, kind, name, digest)
        else:  # a workflow's first run, or a journal of one task: in program order
            seq = self._replayer.next_seq()
        self._after.set(seq)
        replayed = self._replayer.replaying(seq)
        # another task's call came between: journal which this one follows; and the first
        # call's 0 marks a journal written so (``Replayer``: one without is read in seq order)
        if after != seq - 1 or (seq == 1 and not replayed):
            self._follows[seq] = after
        if replayed:  # only a replayed call can diverge: name its line
            self._replayer.note_site(seq, call_site(2 + callers))
        return seq

    def _match(
        self,
        after: int,
        kind: str,
        name: str,
        digest: str | None,
    ) -> int:
        """``take_seq`` in a replay that matches calls: the seq of the recorded call this
        is, told by whether it is the first call of a task another began (a gather's)."""
        new_task = self._first_of_task()
        self._caller.set(id(asyncio.current_task()))
        branch = not self._keys.by_root
        return self._replayer.next_seq(after, kind, name, digest, new_task=new_task, branch=branch)

    def _first_of_task(self) -> bool:
        """Whether the calling task has made no call yet, in a task another began."""
        caller = self._caller.get()
        return caller != 0 and caller != id(asyncio.current_task())

    # --- patches and replayed arguments ------------------------------------------------

    def patched(self, change_id: str) -> bool:
        """``durably.patched(change_id)``: whether this workflow takes the change's new path.

        The same answer for every call with this id in one run (and on every
        replay): the first call decides (``replay.plan_patch``), and journals a
        marker when the workflow reaches the point now.
        """
        known = self._patches.get(change_id)
        if known is not None and not self._matching:
            return known
        plan = replay.plan_patch(self._upcoming_patch(change_id), change_id)
        if known is not None and plan is not replay.Patch.MARKED:
            return known
        if plan is not replay.Patch.MARKED and self._replayer.awaits(
            journal.Kind.PATCH, change_id
        ):  # tasks ran at once: another one asked first in the first run, and journaled
            self._patches[change_id] = True  # the marker, which that one takes when it asks
            return True
        if plan is replay.Patch.PASSED:
            self._patches[change_id] = False
            return False
        seq = self.take_seq(kind=journal.Kind.PATCH, name=change_id)
        if plan is replay.Patch.NEW:
            now = self._services.clock()
            self.stage(
                journal.Entry(seq, journal.Kind.PATCH, change_id, _COMPLETED, 1, None, now, now)
            )
        self._patches[change_id] = True
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """``durably.deprecate_patch(change_id)``: step over the change's marker if the
        journal has one here; journal nothing either way."""
        if change_id in self._patches and not self._matching:
            return
        plan = replay.plan_patch(self._upcoming_patch(change_id), change_id)
        if plan is replay.Patch.MARKED:
            self.take_seq(kind=journal.Kind.PATCH, name=change_id)
        self._patches[change_id] = True

    def _upcoming_patch(self, change_id: str) -> journal.Entry | None:
        """The entry the calling task's next call would replay, a marker of this change
        first (``patched`` decides by it before it takes a seq)."""
        return self._replayer.upcoming(
            self._after.get(), journal.Kind.PATCH, change_id, new_task=self._first_of_task()
        )

    async def check_arguments(self, seq: int, entry: journal.Entry, digest: str | None) -> None:
        """Report a replayed step called with other arguments than the journal recorded.

        Nothing to check when either digest is unknown. Under ``strict_replay``
        this is a divergence (raised, and raised again by every later call);
        otherwise a warning in the log and on the workflow, and the recorded
        result stands.
        """
        if digest is None or entry.args_digest is None or digest == entry.args_digest:
            return
        changed = self._replayer.arguments_changed(seq, entry)
        if self._services.strict_replay:
            raise self._replayer.diverge(changed)
        await self.warn(changed)

    async def warn(self, changed: errors.ArgumentsChanged) -> None:
        """Log a replay's warning and note it on the workflow's row (once)."""
        log.warning("%s", changed)
        store = self._services.store
        try:  # `durably show` and the workflow's info name it
            await store.call(store.store.add_warning, self.workflow_id, str(changed))
        except errors.StoreError as exc:
            log.warning("could not note the warning on workflow %s: %s", self.workflow_id, exc)

    def call_site(self, seq: int) -> str | None:
        """The file and line of the code's call at ``seq``, when it was replayed and known."""
        return self._replayer.site(seq)

    def lookup(self, seq: int, kind: str, name: str) -> journal.Entry | None:
        """The journal's entry for this call, delivering a requested cancellation here.

        A cancellation is delivered once, at the first call that is not already
        final in the journal, and journaled there so a replay raises it at the
        same seq. Not over a step's intent (its outcome unknown): the marker would
        erase it, and a resume would run the step as new; the step settles it
        first (reconcile, or a review, where the cancellation is delivered).
        """
        entry = self._replayer.lookup(seq, kind, name)
        if entry is not None and entry.kind == journal.Kind.CANCEL:
            self.cancellation.delivered = True
            at = self.clock() if entry.started_at is None else entry.started_at
            raise self._cancelled(seq, at)
        if entry is None or not (entry.status in _FINAL or _is_intent(entry)):
            self.cancel_point(seq, kind, name)
        return entry

    def cancel_point(self, seq: int, kind: str, name: str) -> None:
        """Raise Cancelled at ``seq`` if cancellation was requested and not yet delivered.

        The marker journaled there names the call (``kind``, ``name``) it stands in
        for: in a replay of tasks run at once, only that call takes it (``Replayer``).
        """
        cancellation = self.cancellation
        if not cancellation.requested or not cancellation.due:  # the first test is the usual
            return
        self.cancellation.delivered = True
        now = self._services.clock()
        call = "" if kind == journal.Kind.CANCEL else journal.describe_call(kind, name)
        marker = journal.Entry(
            seq, journal.Kind.CANCEL, call, journal.EntryStatus.COMPLETED, 1, None, now, now
        )
        self.stage(marker)
        raise self._cancelled(seq, now)

    def _cancelled(self, seq: int, at: float) -> errors.Cancelled:
        """The Cancelled delivered at ``seq`` at time ``at`` (naming the deadline, if passed)."""
        where = f"(seq {seq})"
        return cancellation.cancelled(self.workflow_id, where, self.cancellation.deadline, at)

    async def cancel_asked(self) -> bool:
        """Whether the workflow must end ``cancelled``: a cancel this run knows of (asked,
        delivered, or journaled), else one the row holds now (a read, for a workflow whose
        function returned with compensations registered: not on any step's path)."""
        known = self.cancellation
        if known.requested or known.delivered or known.in_journal:
            return True
        store = self._services.store
        row = await store.call(store.store.get_workflow, self.workflow_id)
        if row is not None and cancellation.asked(
            row.cancel_requested, row.deadline_at, self.clock()
        ):
            known.requested = True
        return known.requested

    def request_cancel(self) -> None:
        """Cancellation was requested while this run is live: wake its waits to deliver it."""
        self.cancellation.requested = True
        self.poke()


#: The verbs that append entries, a step's or a race's outcome (what the fault observer
#: hears as a commit).
_COMMITS = frozenset({"append_entries", "commit_receipt", "decide_race"})

_STEP = journal.Kind.STEP
_EVENT = journal.Kind.EVENT
#: Journaled values a step could observe: committed before any step starts.
_OBSERVABLE = frozenset({journal.Kind.NOW, journal.Kind.RANDOM, journal.Kind.UUID4})

_COMPLETED = journal.EntryStatus.COMPLETED

_STARTED = journal.EntryStatus.STARTED


def _is_intent(entry: journal.Entry) -> bool:
    """Whether ``entry`` is a step's intent without its receipt: an outcome unknown."""
    return entry.status == _STARTED and entry.kind == journal.Kind.STEP


_FINAL = journal.FINAL_ENTRY_STATUSES


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep


def call_site(start: int) -> tuple[str, int] | None:
    """File and line of the innermost frame outside durably: the user's durable call.

    None when the call was not made from user code on this stack (a branch that
    ``asyncio.gather`` runs as a task starts in asyncio's frames). Runs for every
    replayed call, so it formats nothing, and starts ``start`` frames up (2: the
    caller of its caller): each frame object it makes on the way costs.
    """
    try:
        frame: types.FrameType | None = sys._getframe(start)
    except ValueError:  # a stack shallower than the caller said
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR):
            if filename.startswith(_ASYNCIO_DIR):
                return None
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def _ended() -> Suspended:
    """What a branch's durable call after the workflow function ended raises. Not marked
    ``suspended``: the function's outcome is decided already, and must be committed (a
    branch going on after a sibling failed the gather would otherwise leave the workflow
    running with nothing to drive it)."""
    return Suspended("the workflow function has ended")


@functools.cache
def _run_step() -> Callable[..., Coroutine[Any, Any, Any]]:
    """``step_call.run_step`` (that module imports this one): looked up once, not per step."""
    from durably import step_call

    return step_call.run_step
