"""The storage interface, in domain verbs.

A :class:`Store` is synchronous and used from the
:class:`~durably.storage.thread.StoreThread` that the engine awaits: one thread at
a time, or as many as its ``threads``, each with a connection of its own. Each verb
runs inside a transaction opened by :meth:`Store.run_batch`, which may hold the
verbs of several workflows at once (group commit): a verb that fails is rolled
back alone (the batch runs again with a savepoint for each verb) and the
others still commit once. The engine never sees SQL; a new backend implements
these verbs, or, for a SQL database, only the dialect hooks of
:class:`~durably.storage.sql.SqlStore`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durably import errors, journal
from durably.storage import marks


@dataclasses.dataclass(frozen=True, slots=True)
class Woken:
    """What a signal's send and the claim of what it woke did: whether the signal was
    kept, and the workflow taken with its journal (None when none was taken)."""

    sent: bool
    taken: journal.WorkflowInfo | None = None
    history: list[journal.Entry] | None = None
    #: The parked signal wait completed in the claim's transaction (``take_woken``).
    received: journal.Entry | None = None


@dataclasses.dataclass(slots=True)
class Op:
    """One verb call queued for a batch, with its outcome once run."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    write: bool
    result: Any = None
    error: BaseException | None = None


def lock_order(ops: list[Op]) -> list[Op]:
    """A batch's ops in the order its transaction is to take their rows: by the workflow
    each names (a verb on one workflow takes its id first, a function of ``operations``
    right after the store), those naming none first (a start: its row is new, and a
    call made after it may name it), and each workflow's ops in the order given.

    Two batches of the same workflows then lock them in one order, and seldom wait for
    each other in a cycle: a deadlock, which PostgreSQL ends only after
    ``deadlock_timeout`` (a second by default), undoing one of them. (An op that also
    locks another workflow, a parent its child's finish wakes or a signal's target, can
    still meet one; the store thread runs it again.) The ops of one batch commit together, and
    their callers made them without waiting for each other, so their order is one they
    could have arrived in, but for one workflow's own ops, whose order is kept.
    """
    if len(ops) < 2:
        return ops
    return sorted(ops, key=workflow_named)


def workflow_named(op: Op) -> str:
    """The workflow an op names (``lock_order``); "" for none."""
    args = op.args
    if args and isinstance(args[0], Store):
        args = args[1:]
    first = args[0] if args else None
    return first if isinstance(first, str) else ""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """Which workflows :meth:`Store.search_workflows` returns: every filter given must hold.

    ``ids`` keeps only those ids (an empty tuple: none), ``id_prefix`` the ids
    that start with it (a plain prefix, no wildcards), ``parent_id`` the
    children of that workflow. ``created_after`` is inclusive,
    ``created_before`` exclusive (epoch seconds). ``order`` is ``desc``
    (newest first, the default) or ``asc`` (oldest first), then by id either
    way. ``after`` is the ``(created_at, workflow_id)`` of the last row of the
    previous page (a cursor: a page never repeats a row); ``offset`` skips
    that many rows first.
    """

    status: str | None = None
    name: str | None = None
    queue: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    after: tuple[float, str] | None = None
    limit: int = 100
    ids: tuple[str, ...] | None = None
    id_prefix: str | None = None
    parent_id: str | None = None
    offset: int = 0
    order: str = "desc"


@dataclasses.dataclass(frozen=True, slots=True)
class NewWorkflow:
    """What ``start`` (or a queue's ``enqueue``) commits: the workflow's identity and input.

    A pending workflow with a ``delay`` (seconds) is not claimed before the
    store's clock passes its creation plus the delay. On a partitioned queue,
    ``partition_key`` names the partition its concurrency is counted in. A
    ``debounce_key`` (with a delay) supersedes the workflows of the same queue
    and key that have not started: they end ``cancelled``, never run.
    """

    workflow_id: str
    name: str
    input: str
    version: str | None
    source_hash: str | None
    parent_id: str | None = None
    queue: str | None = None
    priority: int = 0
    deduplication_id: str | None = None
    max_recoveries: int | None = None
    delay: float = 0.0
    partition_key: str | None = None
    debounce_key: str | None = None
    #: Seconds from the start (the commit of this row) to the workflow's deadline.
    timeout: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueLimits:
    """What ``claim_next`` may take from one queue: its limits, as this executor knows them.

    ``concurrency`` bounds the queue's running workflows across every executor
    (``partitioned``: those of each partition key), ``worker_concurrency`` those
    of the claiming executor, and ``rate_limit`` the first claims (starts)
    within any ``rate_per`` seconds. None: no bound.
    """

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: int | None = None
    rate_per: float = 1.0
    partitioned: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Wakeup:
    """What a committed change may wake, as told to listening executors.

    ``kind`` is ``work`` (something may have become claimable), ``signal``
    (``workflow_id`` got signal ``name``), ``cancel`` (``workflow_id`` was asked
    to stop), ``join`` (child ``name`` of ``workflow_id`` finished), ``event``
    (``workflow_id`` published event ``name``) or ``timer`` (a parked workflow is
    due at ``at``).
    """

    kind: str
    workflow_id: str | None = None
    name: str | None = None
    at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Unclaimed:
    """A workflow waiting to be claimed: what tells who could run it."""

    workflow_id: str
    name: str
    version: str | None
    source_hash: str | None
    queue: str | None


#: Runnable workflows are named (name, version); an unversioned workflow has version None.
Runnable = tuple[str, str | None]


#: How many warnings a workflow's row keeps (the newest).
MAX_WARNINGS = 20


def _nothing() -> None:
    """Stop listening where nothing listens."""


class Store(abc.ABC):
    """Workflows, their journals, claims and executors."""

    url: str

    #: Whether ``open`` may create the database (and its schema). A reader sets it False
    #: (see ``create_store``): a database that does not exist then raises DatabaseNotFound.
    create: bool = True

    #: How many threads may run batches at once, each on a connection of its own (see
    #: ``use_own_connection``). 1 where a second writer would only wait for the first
    #: (SQLite's one write lock).
    threads: int = 1

    # --- lifecycle -------------------------------------------------------------

    @abc.abstractmethod
    def open(self) -> None:
        """Connect and bring the schema up to date (runs pending migrations)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection. Idempotent."""

    def use_own_connection(self) -> None:
        """Give the calling thread a connection of its own, from now until ``close``.

        Every other thread shares the store's one connection (one thread at a
        time); a store with ``threads`` > 1 is called so by its extra threads.
        """
        if self.threads > 1:  # pragma: no cover - a backend's bug
            raise NotImplementedError(f"{type(self).__name__} has threads but one connection")

    @abc.abstractmethod
    def run_batch(self, ops: Sequence[Op]) -> None:
        """Run the ops in one transaction and commit once, filling each op's outcome.

        An op that raises is rolled back alone; if the commit itself fails every
        op gets that error.
        """

    def run_inline(self, op: Op) -> bool:
        """Run one op on the caller's thread if that needs no wait for a lock.

        Returns False, having changed nothing, when the op must go to the store
        thread instead. By default nothing runs inline (a network round trip
        must not block the event loop).
        """
        return False

    #: Whether calls made while the event loop is busy may be gathered and run together
    #: on its thread at its next turn (``run_inline_batch``), not handed to a store
    #: thread: where a transaction costs no round trip that would hold the loop (SQLite).
    gathers_inline: bool = False

    def run_inline_batch(self, ops: Sequence[Op]) -> list[bool]:
        """``run_inline`` for several ops, in one transaction (a group commit on the
        caller's thread): for each, whether it ran here; one that did not changed
        nothing and must go to the store thread. By default none runs here."""
        return [False] * len(ops)

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The newest migration applied to this database."""

    # --- workflows -------------------------------------------------------------

    @abc.abstractmethod
    def create_workflow(
        self, new: NewWorkflow, owner: str | None, lease_expires_at: float | None, now: float
    ) -> tuple[journal.WorkflowInfo, bool]:
        """Insert the workflow unless its id exists; return its row and whether it was new.

        With an owner the row is created ``running`` at epoch 1, owned; without,
        ``pending`` at epoch 0 for any executor to claim. A queued workflow whose
        ``deduplication_id`` an unfinished workflow of its queue already holds is
        not created: that one's row is returned, with False. A new workflow with
        a ``debounce_key`` ends, as cancelled and in the same transaction, the
        ones of its queue and key that have not started; the queue's row lock
        makes concurrent debounced enqueues on one queue take turns, so one of
        a burst (the last to commit) is left.
        """

    @abc.abstractmethod
    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        """The workflow's row, or None."""

    @abc.abstractmethod
    def list_workflows(
        self, status: str | None, name: str | None, limit: int
    ) -> list[journal.WorkflowInfo]:
        """Workflows, newest first, optionally filtered by status and name."""

    @abc.abstractmethod
    def search_workflows(self, query: WorkflowQuery) -> list[journal.WorkflowInfo]:
        """One page of workflows matching ``query``, in its order (one read)."""

    @abc.abstractmethod
    def count_by_status(self, cap: int | None = None) -> dict[str, int]:
        """How many workflows each status has (one read; a status with none is absent).

        With ``cap``, no count goes past it (``cap`` then means at least that many):
        a read of at most ``cap`` index entries a status, however long the history.
        """

    @abc.abstractmethod
    def count_unfinished(self) -> dict[str, int]:
        """How many workflows each unfinished status has (one read of the live and parked
        workflows only: its cost does not grow with the finished ones)."""

    @abc.abstractmethod
    def claim_next(
        self,
        owner: str,
        runnable: Sequence[Runnable],
        lease_expires_at: float,
        now: float,
        limit: int,
        queues: Sequence[QueueLimits] = (),
        same_code: Mapping[str, str] | None = None,
    ) -> list[journal.WorkflowInfo]:
        """Select and take up to ``limit`` claimable workflows in one transaction.

        Claimable: unfinished, runnable here (its name and version are in
        ``runnable``), and held by no live lease (pending, released, its
        owner's lease expired, or parked and due). Workflows without a queue
        come first, oldest first; then those of each queue in ``queues``
        (highest priority, then oldest, first), as many as the queue's limits
        leave room for. Rows another claimer is taking at this moment are
        skipped, never waited for; claimers of one queue take turns.

        Each taken workflow is owned by ``owner`` until ``lease_expires_at`` at
        epoch + 1; a crash is counted when it was running under another owner,
        and a claim row records why it changed hands. Returns the new rows.

        ``same_code`` (a strict executor's) maps workflow names to the source
        hash of the code here: a workflow of such a name started by other code
        (another source hash recorded) is not claimable, so it stays for
        another executor and is never taken and let go again.
        """

    @abc.abstractmethod
    def claim_woken(
        self,
        owner: str,
        workflow_id: str,
        runnable: Sequence[Runnable],
        lease_expires_at: float,
        now: float,
        same_code: Mapping[str, str] | None = None,
    ) -> journal.WorkflowInfo | None:
        """Take the one workflow a wake-up named, as ``claim_next`` would take it; else None.

        For a workflow parked on no queue that a signal or a child's end has just made
        due: the engine that saw the wake-up claims it directly, without a pass over
        every claimable row. None when it is not claimable by ``owner`` now (on a
        queue, not due, held by a live lease, not runnable here, or being taken by
        another claimer at this moment): a ``claim_next`` pass then decides.
        """

    @abc.abstractmethod
    def unclaimed(self, now: float, limit: int) -> list[Unclaimed]:
        """Up to ``limit`` workflows claimable now by an executor that runs them, oldest
        first, whether or not this one does (to tell the ones nobody takes)."""

    @abc.abstractmethod
    def load_claims(self, workflow_id: str) -> list[journal.Claim]:
        """Every change of owner of the workflow, oldest first."""

    @abc.abstractmethod
    def release(self, workflow_id: str, epoch: int, now: float, crashed: bool = False) -> None:
        """Let go of one workflow so any executor may claim it at once.

        ``crashed``: its run ended without recording how (a database error, a
        task that died); the release counts as a crash, as a claim after a dead
        owner does, so ``max_recoveries`` ends a run that keeps ending so.
        """

    @abc.abstractmethod
    def release_owned(self, owner: str, now: float) -> int:
        """Let go of every workflow the owner holds; return how many."""

    # --- the journal (every write fenced by the epoch) ---------------------------

    @abc.abstractmethod
    def load_history(self, workflow_id: str) -> list[journal.Entry]:
        """The whole journal of the workflow in seq order, in one query."""

    @abc.abstractmethod
    def history_page(
        self, workflow_id: str, after_seq: int | None, before_seq: int | None, limit: int
    ) -> list[journal.Entry]:
        """One page of the workflow's journal in seq order, in one query through its
        primary key, so that it costs the page's rows however long the journal: the first
        ``limit`` entries after ``after_seq``; else the last ``limit`` before ``before_seq``,
        or the newest ``limit`` without either. An unknown workflow has no entries."""

    @abc.abstractmethod
    def history_steps(self, workflow_id: str, name_prefix: str) -> list[journal.Entry]:
        """The workflow's step entries whose name starts with ``name_prefix``, in seq
        order, in one query: the database passes over the other entries (the model calls
        of a long journal, without sending its every payload)."""

    @abc.abstractmethod
    def history_mark(self, workflow_id: str) -> journal.HistoryMark:
        """What tells this state of the workflow's journal and signals from another, read
        through indexes, never every entry (``HistoryMark``); an unknown workflow has an
        empty one."""

    @abc.abstractmethod
    def append_entries(
        self, workflow_id: str, epoch: int, entries: Sequence[journal.Entry], now: float
    ) -> bool:
        """Write journal entries if the epoch still owns the workflow.

        Raises FencedError otherwise. An entry replaces the one at its seq only
        while that one is not final (completed, failed, timed out). An ``event``
        entry also publishes its value. Returns whether cancellation was requested.
        """

    @abc.abstractmethod
    def finish_workflow(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        output: str | None,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> tuple[str, str | None]:
        """Write the last entries and the final status, fenced; the owner lets go.

        A parent waiting for this workflow is woken. A ``completed`` workflow whose
        cancel was committed before (or whose deadline passed) ends ``cancelled``
        instead, its output kept (``cancellation.final_status``): a cancel, once
        accepted, is final. Returns the status and error recorded.
        """

    # --- waiting (fenced like the journal) -----------------------------------------

    @abc.abstractmethod
    def park(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        wake_at: float | None,
        entries: Sequence[journal.Entry],
        signals: Sequence[str],
        children: Sequence[str],
        now: float,
    ) -> bool:
        """Write entries and let go of a blocked workflow, ``sleeping`` or ``waiting``
        until ``wake_at`` (with None, until a signal or a child wakes it).

        Returns False, without letting go, when one of the awaited ``signals``
        is already there or one of the awaited ``children`` has finished: the
        caller looks again instead of sleeping through it. A workflow asked to
        stop meanwhile parks due at once, so that its next claim delivers it.
        """

    @abc.abstractmethod
    def next_wake(self) -> float | None:
        """The earliest wake-up time of any sleeping or waiting workflow, or deadline
        still to enforce (see ``expire_deadlines``)."""

    @abc.abstractmethod
    def receive_signal(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        """Consume the oldest unconsumed signal named ``wait.name`` into the wait's entry.

        Returns the entry as written: completed with the payload, timed out
        when ``wait.wake_at`` (the deadline) has passed, or ``wait`` itself
        (still started) when there is nothing yet.
        """

    def receive_parked_signal(
        self, workflow_id: str, epoch: int, wait: journal.Entry, now: float
    ) -> journal.Entry:
        """``receive_signal`` of the wait a workflow was parked at, by the claim that took
        it (``operations.take_woken``), with no entries to write first.

        A store may do less: where one statement cannot receive a signal (there is none
        yet, or the wait's entry is not as expected), it may return ``wait`` as it is
        and write nothing; the run then receives it at its wait, as it would have
        without this. PostgreSQL does, so that the statement can go with COMMIT.
        """
        return self.receive_signal(workflow_id, epoch, wait, (), now)

    @abc.abstractmethod
    def send_signal(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
        now: float,
        *,
        tell: bool = True,
    ) -> bool:
        """Keep a signal for the workflow and wake it if it waits; False for a repeated key.

        ``tell=False`` sends no wake-up to listening executors: the caller takes the
        workflow in the same transaction, or else sends it with :meth:`tell_signal`.
        """

    def take_at_once(
        self,
        workflow_id: str,
        signal: tuple[str, str, str | None] | None,
        now: float,
        owner: str,
        runnable: Sequence[Runnable],
        lease_expires_at: float,
        same_code: Mapping[str, str] | None,
    ) -> Woken | None:
        """The wake-up of a workflow committed in one round trip where the store can; None
        where it cannot, having done nothing: the caller then calls the verbs one by one
        (``operations.take_woken``).

        The ``signal`` given (name, payload, idempotency key) is kept first
        (``send_signal(tell=False)``); then the workflow is claimed (``claim_woken``), its
        journal read, and the signal wait it is parked on, if that is all it waits for,
        received (``receive_parked_signal``). A signal kept whose workflow was not taken
        is told to the other executors. A duplicate signal may still take a workflow
        that was due (``sent`` False): the caller then runs it.
        """
        return None

    @abc.abstractmethod
    def tell_signal(self, workflow_id: str, name: str) -> None:
        """The wake-up of a signal kept with ``send_signal(tell=False)``, sent at commit."""

    @marks.alone
    def send_signals(
        self, signals: Sequence[tuple[str, str, str, str | None]], now: float
    ) -> list[bool]:
        """Keep several ``(workflow_id, name, payload, idempotency_key)`` signals, all or
        none (one verb: one savepoint); each as ``send_signal``, in the order given.

        Rows are locked in workflow id order (a stable sort: signals of one workflow
        keep their order), so two batches never wait for each other in a cycle.
        """
        order = sorted(range(len(signals)), key=lambda i: signals[i][0])
        sent = [False] * len(signals)
        for i in order:
            sent[i] = self._send_one_of_many(*signals[i], now)
        return sent

    def _send_one_of_many(
        self, workflow_id: str, name: str, payload: str, idempotency_key: str | None, now: float
    ) -> bool:
        """One signal of :meth:`send_signals`, in that verb's transaction."""
        return self.send_signal(workflow_id, name, payload, idempotency_key, now)

    @abc.abstractmethod
    def get_event(self, workflow_id: str, key: str) -> str | None:
        """The value the workflow last published under ``key``, or None."""

    @abc.abstractmethod
    def live_events(self, key: str, limit: int) -> list[tuple[str, str]]:
        """``(workflow_id, value)`` of event ``key`` in the waiting, then the running
        workflows that published it, newest first, up to ``limit`` of each: one read."""

    # --- messaging from workflow code (fenced like the journal) -------------------------

    @abc.abstractmethod
    def post_signal(
        self,
        workflow_id: str,
        epoch: int,
        send: journal.Entry,
        entries: Sequence[journal.Entry],
        target: str,
        name: str,
        payload: str,
        now: float,
    ) -> journal.Entry:
        """Send signal ``name`` from the workflow to ``target`` and journal the send, all
        or none, in one transaction: the send is made exactly once.

        The signal's idempotency key is ``"<workflow_id>:<send.seq>"``, so a send
        repeated (its first commit's outcome unknown) is not kept twice. Returns the
        send's entry as written: completed, or failed with the error (an unknown or
        finished target) to raise on every replay. A send already final is returned
        as it is.
        """

    @abc.abstractmethod
    def read_event(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        source: str,
        key: str,
        now: float,
    ) -> journal.Entry:
        """Journal what workflow ``source`` published under ``key`` (one transaction).

        Returns the wait's entry as written: completed with the value, timed out
        when ``wait.wake_at`` (the deadline) has passed, else ``wait`` itself
        (still started). A read already final is returned as it is.
        """

    @abc.abstractmethod
    def commit_receipt(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> bool:
        """``append_entries``, and publish the ``(key, value)`` events a step set, at the
        seq of the last entry (its receipt), in the same transaction."""

    @abc.abstractmethod
    def decide_race(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        losers: Sequence[tuple[int, str]],
        now: float,
    ) -> bool:
        """``append_entries`` of a ``wait_first``'s outcome, and, in the same transaction,
        for each losing signal wait ``(seq, name)``: the signal it took (if any) back in
        the workflow's queue, where it was (the oldest of its name again, unless a later
        one was taken meanwhile), and its entry dropped (a replay never starts a loser).
        Idempotent, as a commit repeated must be."""

    @abc.abstractmethod
    def add_warning(self, workflow_id: str, text: str) -> None:
        """Note ``text`` (one line) on the workflow's row, unless it is noted already.

        Atomic; unfenced (a warning is information, not the workflow's state).
        Keeps the newest :data:`MAX_WARNINGS`; a workflow that is gone is ignored.
        """

    @abc.abstractmethod
    def start_child(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        child: NewWorkflow,
        now: float,
    ) -> journal.WorkflowInfo:
        """Journal the start of a child and create it pending (unless it exists); its row.

        The last of ``entries`` is the child's start: it is taken back when the id names a
        workflow of another name (the caller raises WorkflowIdConflict).
        """

    @abc.abstractmethod
    def join_child(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        """Record the outcome of child ``wait.name`` if it finished; the entry as written."""

    # --- operator verbs --------------------------------------------------------------

    @abc.abstractmethod
    def request_cancel(self, workflow_id: str, now: float) -> list[str]:
        """Ask the workflow and its unfinished children to stop; the ids asked.

        Atomic: each one asked is marked in this transaction (a running one
        then holds no place in its queue). One never claimed (``pending`` at
        epoch 0) is ``cancelled`` at once: its code never runs.
        """

    @abc.abstractmethod
    def cancel_selected(self, query: WorkflowQuery, now: float) -> list[str]:
        """``request_cancel`` of every workflow ``query`` selects, chosen and asked in one
        transaction: what is asked is what matches as it is asked, never a workflow
        changed since an earlier read; the ids asked (children too)."""

    @abc.abstractmethod
    def expire_deadlines(self, now: float, limit: int) -> list[str]:
        """Ask up to ``limit`` unfinished workflows past their deadline (and their children)
        to stop, as ``request_cancel`` does, in one transaction; the ids asked."""

    @abc.abstractmethod
    def cancels_asked(self, owner: str) -> list[str]:
        """The workflows ``owner`` holds that were asked to stop (a cancel, a deadline)."""

    @abc.abstractmethod
    def reopen(self, workflow_id: str, now: float) -> journal.WorkflowInfo:
        """Make a failed, cancelled or diverged workflow pending again (``resume``).

        A cancelled one continues from where the cancellation reached it; a
        failed one gives the step that failed it one more attempt. A pending one
        waiting on its queue leaves the queue, to be claimed now by any executor
        with its code, whatever the queue's limits (as DBOS does); any other
        raises NotResumable. Decided under the workflow's row lock.
        """

    @abc.abstractmethod
    def resume_selected(self, query: WorkflowQuery, now: float) -> list[str]:
        """``reopen`` of every workflow ``query`` selects, chosen and reopened in one
        transaction (all or none: one not resumable refuses the call): what is resumed
        is what matches as it goes, never a workflow changed since an earlier read."""

    @abc.abstractmethod
    def fork(
        self, workflow_id: str, from_seq: int, new_id: str, now: float
    ) -> journal.WorkflowInfo:
        """A new pending workflow with the same input and the first ``from_seq`` entries.

        Raises NotForkable when they hold a step whose outcome is open (an intent
        without its receipt, a retry to come): in the fork its key would be another.
        """

    @abc.abstractmethod
    def open_review(
        self,
        workflow_id: str,
        epoch: int,
        intent: journal.Entry,
        idempotency_key: str,
        reason: str,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> None:
        """Put an interrupted intent in the review queue (fenced)."""

    @abc.abstractmethod
    def finish_closing_reviews(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        output: str | None,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> tuple[str, str | None]:
        """``finish_workflow``, and in the same transaction ``close_reviews`` (decided by
        ``ended``): the end of a workflow that leaves a review undecided."""

    @abc.abstractmethod
    def close_reviews(self, workflow_id: str, decided_by: str, now: float) -> int:
        """Close the undecided reviews of a workflow that has ended (nobody could decide
        them any more); how many. A resume that meets the step again opens it again."""

    @abc.abstractmethod
    def reviews(self, workflow_id: str | None) -> list[journal.Review]:
        """Undecided reviews, oldest first (of one workflow, or all)."""

    @abc.abstractmethod
    def resolve(
        self,
        workflow_id: str,
        seq: int,
        decision: str,
        outcome: str | None,
        decided_by: str,
        now: float,
        attempt: int | None = None,
    ) -> journal.Review:
        """Decide a review once: ``result`` (outcome: the result's JSON) becomes the receipt,
        ``retry`` runs the step again with its key, ``fail`` (outcome: the error's JSON)
        fails it. The workflow becomes pending. Raises if nothing awaits a decision there.

        ``attempt``: the review the decision was made for; when the review open at
        ``seq`` is of another attempt (the retried step ended unknown again), raises
        AlreadyResolved (or NothingToResolve) and decides nothing. None: the open one.
        """

    @abc.abstractmethod
    def list_signals(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every signal sent to the workflow, consumed or not."""

    @abc.abstractmethod
    def signals_page(
        self, workflow_id: str, before_num: int | None, limit: int
    ) -> list[dict[str, Any]]:
        """One page of the signals sent to the workflow, consumed or not, in num order, in
        one query through their primary key, so that it costs the page's rows however many
        were sent: the last ``limit`` before ``before_num``, or the newest ``limit``
        without it (the dicts of :meth:`list_signals`). An unknown workflow has none."""

    # --- executors ---------------------------------------------------------------

    @abc.abstractmethod
    def register_executor(self, info: journal.ExecutorInfo) -> None:
        """Announce (or re-announce) a running executor."""

    @abc.abstractmethod
    def heartbeat(
        self, executor: journal.ExecutorInfo, now: float, lease_expires_at: float
    ) -> list[tuple[str, int]]:
        """Record that the executor lives and extend the leases it holds.

        Returns the ``(workflow_id, epoch)`` of every workflow it still holds:
        a run of the executor whose workflow is missing there has lost it.
        An executor forgotten meanwhile (thought dead) is registered again.
        """

    @abc.abstractmethod
    def keep_leases(
        self,
        executor: journal.ExecutorInfo,
        now: float,
        lease_expires_at: float,
        held: Sequence[tuple[str, int]],
    ) -> list[str]:
        """Record that the executor lives and extend the leases of the ``(workflow_id,
        epoch)`` given, each only while the executor still holds it at that epoch.

        Returns the ids it extended. For a process whose event loop cannot beat
        (see :mod:`durably.watchdog`): a workflow finished, released or taken
        over meanwhile is left alone, as the fence demands.
        """

    @abc.abstractmethod
    def list_executors(self) -> list[journal.ExecutorInfo]:
        """Every registered executor."""

    @abc.abstractmethod
    def remove_executor(self, executor_id: str, expire_leases: bool) -> None:
        """Forget an executor; with expire_leases its workflows become claimable now."""

    # --- whole workflows: archives, retention, backups (docs/operations.md) -------------

    @abc.abstractmethod
    def export_ids(self, status: str | None, since: float | None) -> list[str]:
        """The workflows an export selects: of ``status``, created at ``since`` or later."""

    @abc.abstractmethod
    def export_workflows(self, workflow_ids: Sequence[str]) -> list[Any]:
        """Every row of each workflow and of its children (``bulk.ArchivedWorkflow`` s)."""

    @abc.abstractmethod
    def import_workflows(self, workflows: Sequence[Any]) -> list[str]:
        """Insert exported workflows, all or none, without owners; an existing id refuses."""

    @abc.abstractmethod
    def delete_workflows(self, workflow_ids: Sequence[str], force: bool) -> list[str]:
        """Remove the workflows, their children (recursively) and every row naming them,
        all or none (one verb); the ids removed.

        Without ``force`` an unfinished one (or a child whose unfinished parent
        would wait for it) refuses the whole call with WorkflowNotFinished, an
        unfinished child of one with WorkflowHasUnfinishedChildren; an unknown id
        raises WorkflowNotFound. With ``force`` an owner still running
        one is fenced out at its next write.
        """

    @abc.abstractmethod
    def delete_selected(self, query: WorkflowQuery, force: bool) -> list[str]:
        """``delete_workflows`` of every workflow ``query`` selects, chosen and removed in
        one transaction (all or none): what goes is what matches as it goes, never a
        workflow changed since an earlier read; the ids removed."""

    @abc.abstractmethod
    def prune(self, before: float, status: str | None, limit: int) -> list[str]:
        """Remove at most ``limit`` finished workflows last changed before ``before``:
        never a child whose parent is there, nor a parent with an unfinished child."""

    def backup(self, path: str) -> None:
        """Write a consistent copy of the database to the new file ``path``, online.

        Not a verb: it runs outside run_batch, on the store's thread.
        """
        raise errors.BackupNotSupported(f"{self.url} cannot be backed up by durably")

    # --- wake-ups (not verbs: called from any thread, outside run_batch) ----------

    def listen(self, callback: Callable[[Wakeup], None]) -> Callable[[], None]:
        """Call ``callback`` (from another thread) for each committed change that may
        wake something; return the function that stops listening.

        A store without notifications (SQLite) calls nothing: its executors poll.
        After a lost connection the callback gets a ``work`` wake-up, since
        notifications sent meanwhile are lost.
        """
        return _nothing
