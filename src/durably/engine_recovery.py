"""The Engine's recovery: claiming the workflows whose owner is gone, and wake-ups.

A pass (:meth:`Recovery.recover`) runs on every wake-up the store reports, on the
one timer kept for the earliest wake-up known in this process, and every
``poll_interval`` seconds; it claims what is due in one ``claim_next``
transaction and launches a run for each. It also delivers the cancels asked
elsewhere of the runs live here: SQLite tells nothing of another process's
commits, and a NOTIFY on PostgreSQL is lost while the listener is away. A part
of :class:`~durably.engine.Engine`, kept here so that the engine's module holds
its lifecycle and the run of one workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from durably import (
    errors,
    journal,
    liveness,
    loop_errors,
    operations,
    serving,
    telemetry,
    workflow_run,
    workflows,
)
from durably.storage import base, thread

if TYPE_CHECKING:
    from durably.queues import Queue

R = TypeVar("R")

log = logging.getLogger("durably")

#: How many of the oldest unclaimed workflows a pass looks at to tell the ones that no
#: running executor can take (logged once per engine each).
UNCLAIMED_SCAN = 50

#: The most workflows one recovery pass claims (the rest wait for the next pass, which
#: follows at once when this one was full, so that other executors get their share).
CLAIM_BATCH = 100


class Recovery:
    """Engine methods that find and claim work; the Engine supplies what is declared here."""

    clock: Callable[[], float]
    lease_seconds: float
    poll_interval: float
    strict_code: bool
    queues: tuple[Queue, ...]
    _store: thread.StoreThread
    _me: journal.ExecutorInfo | None
    _services: workflow_run.Services | None
    _runs: dict[str, workflow_run.Run]
    _tasks: dict[str, asyncio.Task[Any]]
    _changes: operations.ChangeBroadcast
    _kick: asyncio.Event | None
    _timer: asyncio.TimerHandle | None
    _timer_at: float
    _next_wake: float  # the store's earliest wake-up or deadline, as last read
    _scanned_at: float
    _noted: set[str]
    _other_code: set[str]
    _woken: set[str]  # workflows a wake-up named, for the loop to claim directly
    _pass_due: bool  # a full pass is asked for (not only direct claims)
    _passed_at: float  # self.clock() when the last full pass began

    @property
    def executor_id(self) -> str:
        raise NotImplementedError

    def _require_open(self) -> workflow_run.Services:
        raise NotImplementedError

    async def _call(self, fn: Callable[..., R], *args: Any, write: bool = True) -> R:
        raise NotImplementedError

    def _serving(self, me: journal.ExecutorInfo) -> journal.ExecutorInfo:
        raise NotImplementedError

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
        raise NotImplementedError

    async def recover(self) -> list[str]:
        """Claim and run every unfinished workflow whose owner is gone; return their ids.

        Also takes the work of the engine's queues that their limits leave room for.
        """
        services = self._require_open()
        if services.stopping.is_set():
            return []
        store = self._store.store
        now = self._passed_at = self.clock()
        assert self._me is not None
        self._me = self._serving(self._me)  # the heartbeat registers it again with this
        silent = now - max(10 * self.lease_seconds, 60.0)
        executors = await self._call(store.list_executors, write=False)
        for other in executors:
            if other.executor_id == self.executor_id:
                continue
            if liveness.is_dead_here(other):
                log.info("executor %s is dead; its workflows are free", other.executor_id)
                await self._call(store.remove_executor, other.executor_id, True)
            elif other.heartbeat_at < silent:  # long gone; it registers again if it is not
                await self._call(store.remove_executor, other.executor_id, False)
        if self._next_wake <= now:  # a deadline may be due: cancel what passed it
            expired = await self._call(store.expire_deadlines, now, CLAIM_BATCH)
            for wid in expired:
                self._on_wakeup(base.Wakeup("cancel", wid))
        await self._hear_cancels()
        runnable, same_code = self._claim_filters()
        claimed = await self._call(
            store.claim_next,
            self.executor_id,
            runnable,
            now + self.lease_seconds,
            now,
            CLAIM_BATCH,
            [q.limits for q in self.queues],
            same_code,
        )
        await self._run_claimed(services, claimed)
        if len(claimed) >= CLAIM_BATCH:
            self._kick_recovery()  # there may be more: take it in the next pass
        elif now - self._scanned_at >= 5 * self.poll_interval:
            self._scanned_at = now
            await self._note_unclaimed(executors, now)
        return [info.workflow_id for info in claimed]

    async def _hear_cancels(self) -> None:
        """Deliver to the runs live here the cancels other processes asked of them: one read
        of the rows this executor holds, once a pass (so within ``poll_interval``), and only
        while a run here has not heard of a cancel yet. SQLite tells this process nothing of
        another's commits; PostgreSQL's NOTIFY (``_on_wakeup``) is lost while the listener
        is away, so the read stands behind it there too."""
        if not any(run.listening and not run.cancellation.requested for run in self._runs.values()):
            return
        for wid in await self._call(self._store.store.cancels_asked, self.executor_id, write=False):
            live = self._runs.get(wid)
            if live is not None and not live.cancellation.requested:
                self._on_wakeup(base.Wakeup("cancel", wid))

    def _claim_filters(self) -> tuple[list[base.Runnable], dict[str, str]]:
        """What this engine may claim: its (name, version) pairs, and with ``strict_code``
        the source hash each name must have been started by."""
        assert self._me is not None
        runnable = [(name, version) for name, version, _ in self._me.workflows]
        same_code = {name: h for name, _, h in self._me.workflows if h} if self.strict_code else {}
        return runnable, same_code

    async def _run_claimed(
        self,
        services: workflow_run.Services,
        claimed: list[journal.WorkflowInfo],
        history: list[journal.Entry] | None = None,
        *,
        received: journal.Entry | None = None,
    ) -> None:
        """Launch a run for each workflow just claimed (let go of those it cannot run);
        ``history``, the journal of the one workflow claimed, if it was read with it, and
        ``received``, the signal wait the claim's commit received: its span ends in the
        run, or here if none is launched (no later run would end it)."""
        assert history is None or len(claimed) == 1
        store = self._store.store
        for info in claimed:
            definition = workflows.registered(info.name)
            if definition is None or services.stopping.is_set():  # unregistered meanwhile
                await self._call(store.release, info.workflow_id, info.epoch, self.clock())
                if received is not None:  # no run of it here will end the wait's span
                    wait = received
                    telemetry.wait_ended(
                        info.workflow_id,
                        wait.seq,
                        wait.kind,
                        wait.name,
                        wait.started_at,
                        wait.status,
                        wait.finished_at,
                    )
                continue
            if (
                serving.code_differs(info.source_hash, definition.source_hash)
                and info.workflow_id not in self._other_code
            ):
                self._other_code.add(info.workflow_id)  # not again at each wake-up
                log.warning(
                    "workflow %s (%r) was started by code with source hash %s; this engine "
                    "runs it on code with source hash %s (another application's, or a changed "
                    "function); Engine(strict_code=True) leaves such workflows for another "
                    "worker",
                    info.workflow_id,
                    info.name,
                    info.source_hash,
                    definition.source_hash,
                )
            seq = None if received is None else received.seq
            self._launch(services, info, definition, history=history, received=seq)

    async def _note_unclaimed(self, executors: list[journal.ExecutorInfo], now: float) -> None:
        """Log, once per workflow, the claimable ones that no running executor takes."""
        me = self._me
        assert me is not None
        rows = await self._call(self._store.store.unclaimed, now, UNCLAIMED_SCAN, write=False)
        others = [e for e in executors if e.executor_id != me.executor_id]
        live = [me, *serving.running(others, now)]
        for row in rows:
            if row.workflow_id in self._noted:
                continue
            wanted = serving.describe(row.name, row.version)
            servers = [e for e in live if e.serves(row.name, row.version)]
            mine = me.source_hash_of(row.name, row.version)
            if not servers:
                log.warning(
                    "workflow %s waits for workflow %s, which no running worker has "
                    "registered (this engine has: %s): run a worker that imports its module",
                    row.workflow_id,
                    wanted,
                    ", ".join(n for n, _, _ in me.workflows) or "none",
                )
            elif row.queue is not None and not any(row.queue in e.queues for e in servers):
                log.warning(
                    "workflow %s waits on queue %r, which no running worker with its code "
                    "serves: give the queue to an engine (Engine(queues=[...]) or "
                    "`durably worker MODULE --queue %s`)",
                    row.workflow_id,
                    row.queue,
                    row.queue,
                )
            elif (
                self.strict_code
                and me.serves(row.name, row.version)
                and serving.code_differs(row.source_hash, mine)
            ):
                log.warning(
                    "workflow %s (%s) was started by code with source hash %s; this engine "
                    "has source hash %s and, with strict_code, leaves it for another worker",
                    row.workflow_id,
                    wanted,
                    row.source_hash,
                    mine,
                )
            else:
                continue
            self._noted.add(row.workflow_id)

    async def _claim_woken(self, woken: set[str]) -> bool:
        """Claim each workflow a wake-up named, directly (``claim_woken``); whether all
        were taken. Those that were not (on a queue, not due yet, taken by another
        executor) are left to a full pass."""
        services = self._require_open()
        if services.stopping.is_set():
            return True
        runnable, same_code = self._claim_filters()
        claimer = operations.Claimer(self.executor_id, runnable, self.lease_seconds, same_code)
        every = True
        for workflow_id in woken:
            running = self._tasks.get(workflow_id)
            if running is not None and not running.done():
                live = self._runs.get(workflow_id)
                if live is None or not live.listening:  # still letting go: a pass waits
                    every = False
                continue  # a run of it here will find what woke it
            took = await self._call(
                operations.take_woken, self._store.store, workflow_id, self.clock(), claimer
            )
            if took.taken is None:
                every = False
            else:
                await self._run_woken(services, took)
        return every

    async def _run_woken(self, services: workflow_run.Services, woken: operations.Woken) -> None:
        """Launch the run of the workflow ``take_woken`` claimed, on the journal read with
        it; a signal wait received in that commit ends (its span) in the run."""
        assert woken.taken is not None
        await self._run_claimed(services, [woken.taken], woken.history, received=woken.received)

    def _claim_soon(self, workflow_id: str) -> None:
        """A wake-up for a workflow that no run here holds: the recovery loop claims it
        directly, without a pass over every claimable row."""
        self._woken.add(workflow_id)
        self._wake_loop()

    def _kick_recovery(self) -> None:
        self._pass_due = True
        self._wake_loop()

    def _wake_loop(self) -> None:
        """Wake the handles waiting here and the recovery loop."""
        self._changes.signal()
        if self._kick is not None:
            self._kick.set()

    def _wake_later(self, wake_at: float | None) -> None:
        """A run parked until ``wake_at``: look for work then, from this process.

        One timer, for the earliest wake-up known here: when it fires, the
        recovery loop claims what is due and then waits for the next one the
        store holds (``next_wake``), so a later wake-up needs no timer of its own.
        """
        if wake_at is None or (self._timer is not None and self._timer_at <= wake_at):
            return
        if self._services is None or self._services.stopping.is_set():
            return  # closing: the next engine finds the wake-up in the store
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, wake_at - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._timer_fired)
        self._timer_at = wake_at

    def _timer_fired(self) -> None:
        self._timer = None
        self._kick_recovery()

    def _on_wakeup(self, wakeup: base.Wakeup) -> None:
        """Act on a committed change: poke the run it concerns if it lives here, else
        look for work (on the event loop's thread)."""
        self._changes.signal()
        if self._services is None:
            return
        live = self._runs.get(wakeup.workflow_id or "")
        awake = live is not None and live.listening
        if live is not None and awake and wakeup.kind == "signal":
            live.poke(journal.Kind.SIGNAL, wakeup.name)
        elif live is not None and awake and wakeup.kind == "join":
            live.poke(journal.Kind.JOIN, wakeup.name)
        elif wakeup.kind == "event":  # its readers here re-read it; parked ones are due
            label = f"{wakeup.name} of {wakeup.workflow_id}"
            for run in list(self._runs.values()):
                if run.listening:
                    run.poke(journal.Kind.GET_EVENT, label)
            self._kick_recovery()
        elif live is not None and awake and wakeup.kind == "cancel":
            live.request_cancel()
            self._kick_recovery()  # its place in its queue is free now
        elif wakeup.kind == "timer":
            self._wake_later(wakeup.at)
        elif live is None and wakeup.workflow_id and wakeup.kind in ("signal", "join"):
            self._claim_soon(wakeup.workflow_id)
        else:
            self._kick_recovery()

    def _on_wakeup_threadsafe(self, loop: asyncio.AbstractEventLoop, wakeup: base.Wakeup) -> None:
        """The store's listener thread reports a wake-up."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to wake
            loop.call_soon_threadsafe(self._on_wakeup, wakeup)

    async def _recovery_loop(self) -> None:
        """Look for work on every wake-up, timer and poll, until the engine stops.

        It ends on the stopping flag, not only on a cancellation: a cancellation
        can be lost (see ``operations.wait_event``), and close() must not wait on it forever.
        An error other than the store's is logged (with its traceback once per kind) and
        the next pass follows a back-off (``loop_errors``).
        """
        assert self._kick is not None
        stopping = self._require_open().stopping
        unexpected = loop_errors.LoopErrors("the recovery loop (claims, timers, wake-ups)")
        unread = loop_errors.LoopErrors("the recovery loop's read of the next wake-up")
        claimed_last = True
        read_wake = True
        while not stopping.is_set():
            timeout = self.poll_interval
            try:
                if read_wake:  # not after a direct claim: it changed no wake-up to come
                    due = await self._call(self._store.store.next_wake, write=False)
                    self._next_wake = float("inf") if due is None else due
                due = None if self._next_wake == float("inf") else self._next_wake
                # A wake-up already past that the last pass could not claim belongs to
                # workflows this engine cannot run (other code or version, a full queue):
                # wait the poll interval, don't spin on it.
                if due is not None and (claimed_last or due > self.clock()):
                    timeout = min(timeout, max(0.0, due - self.clock()))
            except errors.StoreError as exc:
                log.warning("cannot read the next wake-up: %s", exc)
            except Exception as exc:  # not the store's: the wait below is the poll's
                unread.failed(exc)
            else:
                unread.succeeded()
            await operations.wait_event(self._kick, timeout)
            if stopping.is_set():
                return
            kicked = self._kick.is_set()
            self._kick.clear()
            woken, self._woken = self._woken, set()
            # Direct claims alone only while a pass ran less than a poll interval ago: else
            # a stream of wake-ups would keep the pass (other executors' work, timers,
            # deadlines) from ever running. Due work known here ends the wait at once, so
            # the next wait that no wake-up cuts short runs the pass anyway.
            recent = self.clock() - self._passed_at < self.poll_interval
            direct = woken and kicked and recent and not self._pass_due
            try:
                if direct and await self._claim_woken(woken):
                    read_wake = False
                    unexpected.succeeded()
                    continue
                self._pass_due = False
                read_wake = True
                claimed_last = bool(await self.recover())
            except errors.StoreError as exc:
                self._woken |= woken  # claimed by the next pass, at once
                self._pass_due = read_wake = True
                log.warning("recovery pass failed: %s", exc)
            except Exception as exc:  # a driver's OSError, a bug: a pass again, after a pause
                self._woken |= woken
                self._pass_due = read_wake = True
                await operations.wait_event(stopping, unexpected.failed(exc))
            else:
                unexpected.succeeded()
