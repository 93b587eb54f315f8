"""The Engine: starts workflows, runs them, and recovers the ones whose owner died.

An engine is one executor. On entry it opens the store, registers itself, and
claims every unfinished workflow whose owner is gone (at once for a dead
process on this host, after the lease for others), in one ``claim_next``
transaction per pass, together with the work of the queues it serves. Each
claimed or started workflow runs as an asyncio task that replays its journal
from the first line. Leases are renewed by one heartbeat for the whole
executor, which also notices the workflows this executor lost (see
:mod:`durably.leases`). A pass runs when the store reports a wake-up
(PostgreSQL's LISTEN/NOTIFY), when a timer of this process is due, and every
``poll_interval`` seconds as the fallback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from durably import (
    engine_decisions,
    engine_many,
    engine_recovery,
    errors,
    faults,
    journal,
    leases,
    liveness,
    operations,
    run_types,
    validate,
    waits,
    watchdog,
    workflow_run,
    workflow_task,
    workflows,
)
from durably import retention as retention_policy
from durably import step_threads as step_threads_mod
from durably.storage import base, create_store, resolve_url, thread

if TYPE_CHECKING:
    from durably.queues import Queue

log = logging.getLogger("durably")

#: Seconds close() gives a task it asked to end (a background loop, a run cancelled after
#: the drain) before it cancels it, and then again before it gives up on it, naming it.
STOP_GRACE = 5.0

R = TypeVar("R")


class WorkflowHandle:
    """A started workflow: read its status or wait for its result."""

    def __init__(self, engine: Engine, workflow_id: str) -> None:
        self.engine = engine
        self.workflow_id = workflow_id

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id!r}>"

    async def info(self) -> journal.WorkflowInfo:
        """The workflow's row as stored now."""
        return await self.engine.get_workflow(self.workflow_id)

    async def status(self) -> str:
        """The workflow's status now (see ``durably.Status``)."""
        return (await self.info()).status

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow to finish; return its result or raise its error.

        A failed workflow re-raises its error (the original type when it can be
        rebuilt); a diverged one raises NonDeterminismError; a cancelled one
        Cancelled. Raises TimeoutError after ``timeout`` seconds.

        While the workflow runs in this engine, this waits on its task; else
        until the engine learns of a change (a wake-up from the store, a run of
        its own ending or parking), reading the row at a growing interval (up
        to a second) for what nothing reports, such as a finish on another host.
        """
        engine = self.engine
        loop = asyncio.get_running_loop()
        if timeout is not None:
            timeout = validate.number(timeout, "result(timeout)")
        deadline = None if timeout is None else loop.time() + timeout
        for delay in operations.delays(0.01, 1.5, 1.0):
            mark = engine._changes.mark()
            task = engine._tasks.get(self.workflow_id)
            if task is not None:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                await asyncio.wait({task}, timeout=left)
                ended = _ended(task)
                if ended is not None:  # it ended here: as committed, without reading the row
                    return waits.finished_outcome(f"workflow {self.workflow_id!r}", *ended)
            info = await self.info()
            if info.finished:
                return outcome(info)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"workflow {self.workflow_id!r} is still {info.status}")
            wait = delay if deadline is None else min(delay, deadline - loop.time())
            await engine._changes.wait(mark, wait)
        raise AssertionError("unreachable: delays() never ends")


def _ended(task: asyncio.Task[run_types.Outcome | None]) -> run_types.Outcome | None:
    """How a finished run's task ended its workflow, if it did (not parked, lost, failed)."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


def outcome(info: journal.WorkflowInfo) -> Any:
    """A finished workflow's result, or raise its recorded error."""
    return waits.finished_outcome(
        f"workflow {info.workflow_id!r}", info.status, info.output, info.error
    )


class Engine(engine_recovery.Recovery, engine_decisions.Decisions, engine_many.ManyWorkflows):
    """Runs durable workflows against one database (an async context manager).

    ``url`` is ``sqlite:///path`` or ``postgresql://...`` (default:
    ``DURABLY_DATABASE_URL``, else ``sqlite:///durably.db``). ``lease_seconds``
    bounds how long another host waits before taking over the work of an
    executor that vanished; ``max_recoveries`` is how many crashes in a row,
    without any progress in its journal, a workflow may cause before it is
    marked failed. ``queues`` are the :class:`~durably.Queue` s whose work
    this engine also runs, within their limits (workflows started without a
    queue are always served). ``poll_interval`` is how often it looks for work,
    and on SQLite for the cancels other processes asked of its runs, without being
    told (PostgreSQL tells it at once). ``hold_seconds`` is how
    long a blocked workflow stays in memory before it parks. With
    ``inline_commits`` (the default) a SQLite commit runs on the event loop's
    thread when nothing else is ready to run there (see docs/decisions.md).

    A workflow records the source hash of the code that started it. An engine
    whose code for it differs (another application sharing the database, a
    changed function) logs a warning with both hashes when it claims it and
    runs it anyway; with ``strict_code`` it never claims it and leaves it for
    an executor with the same code. Workflows that no running executor can
    take (nobody has their code or serves their queue) are logged once.

    With ``retention``, finished workflows older than that are pruned, with
    their journals, in small batches (docs/operations.md).

    A replayed step called with other arguments than its journal recorded is a
    warning, in the log and on the workflow (``WorkflowInfo.warnings``); with
    ``strict_replay`` the workflow stops as ``diverged`` instead
    (docs/deploying.md).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        lease_seconds: float = 30.0,
        max_recoveries: int = 5,
        poll_interval: float = 1.0,
        hold_seconds: float = 1.0,
        inline_commits: bool = True,
        step_threads: int = 32,
        executor_id: str | None = None,
        clock: Callable[[], float] = time.time,
        queues: Sequence[Queue] = (),
        strict_code: bool = False,
        retention: datetime.timedelta | None = None,
        strict_replay: bool = False,
    ) -> None:
        self.lease_seconds = validate.number(lease_seconds, "lease_seconds", above=True)
        self.max_recoveries = validate.count(max_recoveries, "max_recoveries", low=0)
        self.poll_interval = validate.number(poll_interval, "poll_interval", above=True)
        self.hold_seconds = validate.number(hold_seconds, "hold_seconds")
        validate.count(step_threads, "step_threads")
        self.inline_commits = inline_commits
        self.clock = clock
        self.queues = tuple(queues)
        self.strict_code = strict_code
        self.strict_replay = strict_replay
        self._noted: set[str] = set()  # workflows logged as taken by nobody (once each)
        self._other_code: set[str] = set()  # workflows logged as run on other code (once each)
        self._warned_queues: set[str] = set()  # queues enqueued on without serving them
        self._scanned_at = float("-inf")
        self.retention = retention  # finished workflows older than this are pruned
        if len({q.name for q in self.queues}) != len(self.queues):
            raise ValueError("each queue may be given once")
        self._database = resolve_url(url)  # with its password, for the watchdog's connection
        self._store = thread.StoreThread(create_store(self._database))
        self.url = self._store.store.url  # as shown in messages: without a password
        self._step_thread_count = step_threads
        self._step_threads = step_threads_mod.StepThreads(step_threads, "durably-step")
        self._executor_id = executor_id
        self._me: journal.ExecutorInfo | None = None
        self._tasks: dict[str, asyncio.Task[run_types.Outcome | None]] = {}
        self._epochs: dict[str, int] = {}  # the epoch each task in _tasks was launched at
        self._runs: dict[str, workflow_run.Run] = {}
        self._background: list[asyncio.Task[None]] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: watchdog.Watchdog | None = None
        self._drained: asyncio.Event | None = None  # set by close() once running steps ended
        self._services: workflow_run.Services | None = None
        self._kick: asyncio.Event | None = None
        self._changes = operations.ChangeBroadcast()  # wakes handles and get_event waiting here
        self._timer: asyncio.TimerHandle | None = None  # for the earliest wake-up known here
        self._timer_at = 0.0
        self._next_wake = float("-inf")  # the store's earliest wake-up or deadline, last read
        self._woken: set[str] = set()
        self._pass_due = False
        self._passed_at = float("-inf")
        self._ops = operations.Operations(self._store.store, clock)
        self._leases = leases.Leases(
            self._store, lease_seconds, clock, self._tasks.keys, self._kick_recovery
        )
        self._stop_listening: Callable[[], None] = lambda: None

    # --- lifecycle -------------------------------------------------------------

    @property
    def executor_id(self) -> str:
        """This executor's id, as recorded in leases and claims."""
        if self._me is None:
            raise errors.EngineNotOpen("the engine is not open; use `async with Engine(...)`")
        return self._me.executor_id

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the database, register this executor and recover orphaned workflows."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._store.start)
        faults.reached("engine_start")
        # threads of its own each time it opens: close() shut the last ones down for good
        self._step_threads = step_threads_mod.StepThreads(self._step_thread_count, "durably-step")
        self._me = self._serving(liveness.this_executor(self.clock(), self._executor_id))
        self._services = workflow_run.Services(
            store=self._store,
            clock=self.clock,
            step_threads=self._step_threads,
            stopping=asyncio.Event(),
            on_park=self._wake_later,
            on_child=lambda child_id: self._kick_recovery(),
            on_signal=lambda wid, name: self._on_wakeup(base.Wakeup("signal", wid, name)),
            on_event=lambda wid, key: self._on_wakeup(base.Wakeup("event", wid, key)),
            hold_seconds=self.hold_seconds,
            inline_commits=self.inline_commits,
            strict_replay=self.strict_replay,
        )
        self._kick = asyncio.Event()
        self._changes = operations.ChangeBroadcast()
        try:
            await self._call(self._store.store.register_executor, self._me)
            self._stop_listening = await loop.run_in_executor(
                None, self._store.store.listen, functools.partial(self._on_wakeup_threadsafe, loop)
            )
            await self.recover()
        except BaseException:
            self._services = None
            await loop.run_in_executor(None, self._stop_listening)
            await loop.run_in_executor(None, self._store.stop)
            raise
        self._drained = asyncio.Event()
        self._background = [
            asyncio.create_task(self._recovery_loop(), name="durably-recovery"),
        ]
        self._heartbeat = asyncio.create_task(
            self._leases.heartbeat_loop(self._drained, self._me, self._services.stopping),
            name="durably-heartbeat",
        )
        self._watchdog = watchdog.Watchdog(
            self._database, self._me, self.lease_seconds, self.clock, self._held_here
        )
        self._watchdog.start()
        if self.retention is not None:
            pruning = retention_policy.prune_loop(
                self._call,
                self._store.store.prune,
                self.clock,
                self.retention,
                self._services.stopping,
            )
            self._background.append(asyncio.create_task(pruning, name="durably-retention"))

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop: running steps finish and commit, workflows suspend, leases are released.

        The heartbeat keeps the leases of the runs still draining until they end
        (another executor must not start their steps again meanwhile); then they
        are released at once. Every wait is bounded, so close() always returns:
        a run still going after ``drain_timeout`` seconds, or a background loop
        after ``STOP_GRACE``, is cancelled; one that ignores its cancellation
        (a step that swallows CancelledError), or a thread that does not stop,
        is left behind after ``STOP_GRACE`` more and named in an error log.
        """
        drain_timeout = validate.number(drain_timeout, "drain_timeout")
        if self._services is None:
            self._store.stop()
            self._step_threads.shutdown()
            return
        assert self._kick is not None and self._drained is not None
        loop = asyncio.get_running_loop()
        self._services.stopping.set()
        self._kick.set()  # the recovery loop sees the engine stopping and ends
        await _within(loop.run_in_executor(None, self._stop_listening), "the wake-up listener")
        for live in list(self._runs.values()):
            live.poke()  # blocked waits re-check, see the engine stopping and park
        await _end_tasks(self._background, STOP_GRACE, "background task")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await _end_tasks(list(self._tasks.values()), drain_timeout, "workflow run")
        self._drained.set()  # nothing runs here any more: the heartbeat may stop
        heartbeat = [] if self._heartbeat is None else [self._heartbeat]
        await _end_tasks(heartbeat, STOP_GRACE, "background task")
        if self._watchdog is not None:
            self._watchdog.stop()
            await _within(loop.run_in_executor(None, self._watchdog.join), "the watchdog thread")
            self._watchdog = None
        try:
            async with asyncio.timeout(STOP_GRACE):
                await self._call(self._store.store.release_owned, self.executor_id, self.clock())
                await self._call(self._store.store.remove_executor, self.executor_id, False)
        except (errors.StoreError, TimeoutError) as exc:
            log.warning("could not release leases on close: %r", exc)
        self._services = None
        await _within(loop.run_in_executor(None, self._store.stop), "the store thread")
        self._step_threads.shutdown()

    def _held_here(self) -> list[tuple[str, int]]:
        """The (workflow_id, epoch) of every workflow a task of this engine drives.

        Not those whose run let go (finished, parked, lost, abandoned). Read by the
        watchdog's thread while the event loop is blocked (nothing changes then).
        """
        held = []
        for wid, epoch in list(self._epochs.items()):
            run = self._runs.get(wid)
            if run is not None and run.epoch == epoch and run.let_go:
                continue
            held.append((wid, epoch))
        return held

    def _serving(self, me: journal.ExecutorInfo) -> journal.ExecutorInfo:
        """``me`` saying what it serves now (the registry may grow after open)."""
        served = tuple(
            (d.name, d.version, d.source_hash)
            for name in workflows.registered_names()
            if (d := workflows.registered(name)) is not None
        )
        queues = tuple(q.name for q in self.queues)
        if (served, queues) == (me.workflows, me.queues):
            return me
        return dataclasses.replace(me, workflows=served, queues=queues)

    def _require_open(self) -> workflow_run.Services:
        if self._services is None:
            raise errors.EngineNotOpen("the engine is not open; use `async with Engine(...)`")
        return self._services

    async def _call(self, fn: Callable[..., R], *args: Any, write: bool = True) -> R:
        return await self._store.call(fn, *args, write=write)

    async def _run(self, plan: operations.Plan[R], *, inline: bool = False) -> R:
        """Run a plan of store calls; ``inline``: one made while the loop is quiet may run on
        the loop's thread (with ``inline_commits``), as a run's commits do."""
        inline = inline and self.inline_commits
        return await operations.run_async(plan, self._store, self._changes, inline=inline)

    # --- starting and reading workflows -------------------------------------------

    async def start(
        self,
        wf: Any,
        *args: Any,
        workflow_id: str | None = None,
        max_recoveries: int | None = None,
        delay: float = 0.0,
        timeout: float | datetime.timedelta | None = None,
        **kwargs: Any,
    ) -> WorkflowHandle:
        """Start a workflow; return once its id and input are committed.

        ``wf`` is a decorated workflow or the name of one registered in this
        process (an unknown name raises WorkflowNotRegistered: a typo fails at
        once; ``Client.start`` commits names for workers that have the code).
        It starts running here at once. Starting an id that exists returns the
        existing workflow and runs nothing; a different workflow under that id
        raises WorkflowIdConflict. ``max_recoveries``, recorded with the workflow,
        overrides the decorator's and this engine's limit on crashes in a row.
        With a ``delay`` (seconds) it is committed pending instead, and no engine
        starts it before the delay has passed.
        ``timeout`` (seconds or a timedelta; else the decorator's) gives it a
        deadline, stored in its row (``info.deadline_at``): once it passes, the
        workflow and its children are cancelled wherever they are, parked or
        running, and its error names the deadline.
        """
        services = self._require_open()
        seconds = validate.number(delay, "delay")
        if isinstance(wf, str):
            validate.name(wf, "workflow name")
            workflows.definition_of(wf)  # WorkflowNotRegistered, naming what is known
        new, definition = operations.new_workflow(
            wf, args, kwargs, workflow_id, max_recoveries, timeout, seconds
        )
        owner = None if definition is None or seconds > 0 else self.executor_id

        def committed(found: tuple[journal.WorkflowInfo, bool]) -> None:
            # Called once committed even if our caller is cancelled meanwhile: a workflow
            # owned here and not run would wait for the heartbeat to count it a crash.
            info, created = found
            if created and definition is not None and owner is not None:
                self._launch(services, info, definition, fresh=True)
            elif not info.finished:
                self._kick_recovery()

        await self._run(self._ops.start(new, owner, self.lease_seconds, committed), inline=True)
        return WorkflowHandle(self, new.workflow_id)

    async def submit(self, new: base.NewWorkflow) -> journal.WorkflowInfo:
        """Commit a pending workflow for any engine to claim (a queue's ``enqueue``).

        Returns the row: the new one, or the one already holding its id or its
        queue's deduplication id. Warns (once per queue) when this engine does not
        serve the queue: a forgotten ``Engine(queues=[...])`` otherwise leaves the
        work waiting silently.
        """
        self._require_open()
        queue = new.queue
        if (
            queue is not None
            and queue not in {q.name for q in self.queues}
            and queue not in self._warned_queues
        ):
            self._warned_queues.add(queue)
            log.warning(
                "workflow %s was enqueued on queue %r, which this engine does not serve: "
                "it runs only on an engine given the queue (Engine(url, queues=[...]) or "
                "`durably worker MODULE --queue %s`)",
                new.workflow_id,
                queue,
                queue,
            )
        info, created = await self._call(
            self._store.store.create_workflow, new, None, None, self.clock()
        )
        if created:
            self._kick_recovery()
        return info

    def handle(self, workflow_id: str) -> WorkflowHandle:
        """A handle to an existing workflow (checked when used)."""
        return WorkflowHandle(self, workflow_id)

    async def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo:
        """The workflow's row; WorkflowNotFound if there is none."""
        return await self._run(self._ops.get_workflow(workflow_id))

    async def history(self, workflow_id: str) -> list[journal.Entry]:
        """The workflow's journal, in seq order."""
        return await self._run(self._ops.history(workflow_id))

    async def history_page(
        self,
        workflow_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int,
    ) -> list[journal.Entry]:
        """One page of the workflow's journal, in seq order, read through its primary key
        (``Client.history_page``)."""
        return await self._run(self._ops.history_page(workflow_id, after_seq, before_seq, limit))

    async def history_steps(self, workflow_id: str, name_prefix: str = "") -> list[journal.Entry]:
        """The workflow's step entries whose name starts with ``name_prefix``, in seq order,
        chosen by the database (``Client.history_steps``)."""
        return await self._run(self._ops.history_steps(workflow_id, name_prefix))

    async def history_mark(self, workflow_id: str) -> journal.HistoryMark:
        """What tells this state of the workflow's journal and signals from another, read
        through indexes (``Client.history_mark``)."""
        return await self._run(self._ops.history_mark(workflow_id))

    async def claims(self, workflow_id: str) -> list[journal.Claim]:
        """Every change of owner of the workflow: starts, recoveries, resumes."""
        return await self._run(self._ops.claims(workflow_id))

    async def executors(self) -> list[journal.ExecutorInfo]:
        """The executors registered in the database."""
        return await self._run(self._ops.executors())

    async def signals(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every signal sent to the workflow, consumed or not."""
        return await self._run(self._ops.signals(workflow_id))

    async def signals_page(
        self, workflow_id: str, *, before_num: int | None = None, limit: int
    ) -> list[dict[str, Any]]:
        """One page of the signals sent to the workflow, in num order, read through their
        primary key (``Client.signals_page``)."""
        return await self._run(self._ops.signals_page(workflow_id, before_num, limit))

    # --- signals, events, cancel, resume, fork -------------------------------------------

    async def send_signal(
        self,
        workflow_id: str,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
    ) -> bool:
        """Send a signal; committed before this returns. False if the key was used before.

        The workflow may wait for it later: it is kept, and each signal goes to
        exactly one ``wait_for_signal`` of that name, in the order sent. Raises
        WorkflowNotFound for an unknown id, and WorkflowFinished if the workflow has
        ended (nothing could ever receive the signal, so it is not kept).
        """
        services = self._services
        running = self._tasks.get(workflow_id)  # a run of it here (done: only forgotten late)
        live = self._runs.get(workflow_id)
        if running is not None and not running.done() and live is not None and not live.listening:
            # it has just parked and is letting go: moments from now it is not here
            await asyncio.wait({running}, timeout=LETTING_GO)
        if services is None or services.stopping.is_set() or (running and not running.done()):
            plan = self._ops.send_signal(workflow_id, name, payload, idempotency_key)
            sent = await self._run(plan, inline=True)
            if sent:  # a duplicate changed nothing: nothing to wake
                self._on_wakeup(base.Wakeup("signal", workflow_id, name))
            return sent
        # No run of it here: if it is parked and this engine can run it, take it with the
        # signal, in the same commit, with its journal. Shielded: a caller cancelled once
        # the commit is on its way must not leave the workflow claimed and not running.
        runnable, same_code = self._claim_filters()
        claimer = operations.Claimer(self.executor_id, runnable, self.lease_seconds, same_code)
        taking = self._ops.send_signal_and_claim(
            workflow_id, name, payload, idempotency_key, claimer
        )
        return await asyncio.shield(self._send_and_take(services, taking, workflow_id, name))

    async def _send_and_take(
        self,
        services: workflow_run.Services,
        plan: operations.Plan[operations.Woken],
        workflow_id: str,
        name: str,
    ) -> bool:
        """Run ``plan`` (``send_signal_and_claim``), then the workflow it took, if any."""
        woken = await self._run(plan, inline=True)
        if woken.taken is not None:
            self._changes.signal()
            await self._run_woken(services, woken)
        elif woken.sent:
            self._on_wakeup(base.Wakeup("signal", workflow_id, name))
        return woken.sent

    async def get_event(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        """The value the workflow published under ``key``, waiting up to ``timeout`` for it.

        Raises TimeoutError if it is still unpublished then (None means: don't wait).
        """
        return await self._run(self._ops.get_event(workflow_id, key, timeout))

    async def cancel(self, workflow_id: str) -> list[str]:
        """Cancel the workflow and its unfinished children; the ids asked to stop.

        Each receives ``durably.Cancelled`` at its next durable call (a wait now; a
        step already running is not interrupted), so its ``finally`` blocks and
        compensations still run as steps. Asked from another process on SQLite, it
        reaches a run held in memory within its engine's ``poll_interval``. The cancel is
        final once this returns: one not started yet never starts (it is
        ``cancelled`` at once), and one whose function returns without another
        durable call ends ``cancelled`` with its result kept in ``output``. A
        queued one frees its place in its queue at once.
        """
        asked = await self._run(self._ops.cancel(workflow_id))
        for wid in asked:
            self._on_wakeup(base.Wakeup("cancel", wid))
        return asked

    async def resume(self, workflow_id: str) -> WorkflowHandle:
        """Run a failed, cancelled or diverged workflow again from where it stopped; start
        a pending one waiting on its queue now, past the queue's limits (as DBOS does)."""
        await self._run(self._ops.resume(workflow_id))
        self._kick_recovery()
        return WorkflowHandle(self, workflow_id)

    async def fork(
        self, workflow_id: str, from_seq: int, workflow_id_new: str | None = None
    ) -> WorkflowHandle:
        """Start a copy whose first ``from_seq`` journal entries are the original's.

        The rest runs live, on the code now loaded: for debugging an agent from
        its third model call with changed code. Raises ``errors.NotForkable`` when
        those entries hold a step whose outcome is open (an intent without its
        receipt, a retry to come): in the fork its idempotency key would be another.
        """
        new_id = await self._run(self._ops.fork(workflow_id, from_seq, workflow_id_new))
        self._kick_recovery()
        return WorkflowHandle(self, new_id)

    # --- running one workflow ---------------------------------------------------------

    def _launch(
        self,
        services: workflow_run.Services,
        info: journal.WorkflowInfo,
        definition: workflows.WorkflowDefinition,
        *,
        fresh: bool = False,
        history: list[journal.Entry] | None = None,
        received: int | None = None,
    ) -> None:
        """Run the workflow in a task; ``fresh`` (just created here) has no journal to read,
        a ``history`` read with the claim need not be read again, and ``received`` is the
        seq of a signal wait the claim received (the run ends its span)."""
        wid = info.workflow_id
        previous = self._tasks.get(wid)  # a run of it here that is still letting go
        known = [] if fresh else history
        task = asyncio.create_task(
            self._drive(services, info, definition, previous, known, received),
            name=f"durably:{wid}",
        )
        self._tasks[wid] = task
        self._epochs[wid] = info.epoch
        task.add_done_callback(functools.partial(self._forget_task, wid))

    def _forget_task(self, workflow_id: str, task: asyncio.Task[run_types.Outcome | None]) -> None:
        if self._tasks.get(workflow_id) is task:
            del self._tasks[workflow_id]
            self._epochs.pop(workflow_id, None)
        if not task.cancelled() and (died := task.exception()) is not None:
            # Nothing recorded how it ended: the heartbeat releases it as a crash.
            log.error(
                "the run of workflow %s died with %s: %s; it counts as a crash",
                workflow_id,
                type(died).__name__,
                died,
                exc_info=died,
            )

    async def _drive(
        self,
        services: workflow_run.Services,
        info: journal.WorkflowInfo,
        definition: workflows.WorkflowDefinition,
        previous: asyncio.Task[run_types.Outcome | None] | None,
        known: list[journal.Entry] | None,
        received: int | None = None,
    ) -> run_types.Outcome | None:
        """Run the workflow here (on ``known``, its journal as read with its claim, if it
        was); how it ended it, if this run did (not parked, not lost)."""
        wid = info.workflow_id
        if previous is not None:
            await asyncio.wait({previous})
        try:
            history = (
                known
                if known is not None
                else await self._call(self._store.store.load_history, wid, write=False)
            )
        except errors.StoreError as exc:  # the heartbeat releases what nothing runs
            log.warning("cannot load the journal of workflow %s: %s", wid, exc)
            return None
        live = workflow_run.Run(services, info, history, definition.version, definition.source_hash)
        live.received_at_claim = received
        self._runs[wid] = live
        self._leases.track(live)
        try:
            limit = next(
                n
                for n in (info.max_recoveries, definition.max_recoveries, self.max_recoveries)
                if n is not None
            )
            await workflow_task.drive(live, info, definition, history, limit)
        finally:
            if self._runs.get(wid) is live:
                del self._runs[wid]
            self._leases.untrack(live)
            self._changes.signal()  # it finished or parked: handles waiting here look again
        if info.queue is not None:
            self._kick_recovery()  # a place in its queue is free
        if info.parent_id is not None and live.state is workflow_run.State.RETIRED:
            parent = self._runs.get(info.parent_id)
            if parent is not None and parent.listening:
                parent.poke(journal.Kind.JOIN, wid)
            else:  # none here, or one that parked and is letting go: no wait of it would see it
                self._claim_soon(info.parent_id)
        return live.ended


async def _end_tasks(tasks: Sequence[asyncio.Task[Any]], patience: float, what: str) -> None:
    """Wait for tasks asked to end; cancel those still running after ``patience`` seconds.

    A task still running ``STOP_GRACE`` seconds after its cancellation ignores
    it: it is left behind and named in an error log, so that close() returns.
    """
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=patience)
    for task in late:
        task.cancel()
    stuck: set[asyncio.Task[Any]] = set()
    if late:
        _, stuck = await asyncio.wait(late, timeout=STOP_GRACE)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("%s %s failed: %r", what, task.get_name(), task.exception())
    if stuck:
        log.error(
            "close: gave up on %d %s(s) that did not end %.1f s after being cancelled "
            "(they swallow CancelledError): %s",
            len(stuck),
            what,
            STOP_GRACE,
            ", ".join(sorted(task.get_name() for task in stuck)),
        )


async def _within(future: asyncio.Future[None], what: str) -> None:
    """Wait ``STOP_GRACE`` seconds at most for a thread's work; else name it and go on."""
    done, _ = await asyncio.wait({future}, timeout=STOP_GRACE)
    if not done:
        log.error("close: gave up waiting for %s after %.1f s", what, STOP_GRACE)
        return
    future.result()


#: How long ``send_signal`` waits for a run of the workflow here that has just parked to
#: let go (seconds), so that it can take the workflow with the signal in one commit.
LETTING_GO = 0.05


def run(
    wf: Callable[..., Coroutine[Any, Any, R]],
    *args: Any,
    workflow_id: str | None = None,
    database: str | None = None,
    **kwargs: Any,
) -> R:
    """Run a workflow to its end from synchronous code and return its result.

    Re-running with the same ``workflow_id`` resumes it (or returns its result).
    """

    async def main() -> R:
        async with Engine(database) as engine:
            handle = await engine.start(wf, *args, workflow_id=workflow_id, **kwargs)
            result: R = await handle.result()
            return result

    return asyncio.run(main())
