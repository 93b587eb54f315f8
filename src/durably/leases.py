"""The heartbeat of one executor: renewing its leases and noticing the ones it lost.

An engine holds each workflow it runs under a lease (owner, expiry, epoch).
Every ``lease_seconds / 3`` the heartbeat extends all of them in one statement,
which also reports which workflows, at which epochs, the executor still holds.
From that it settles two things a single commit cannot see:

* **lost leases.** A run of this executor whose workflow is now at a later
  epoch (another executor claimed it after this one stalled: a long GC pause,
  a SIGSTOP, a network cut) must stop touching it. Its commits would already be
  rejected by the fence; the heartbeat also stops the run at once, so a step
  that is still running is cancelled instead of finishing an effect nobody
  will record.
* **orphans.** A workflow the store says this executor holds but that no run of
  it drives (a claim whose commit outcome was lost with the connection, a run
  that ended on a database error) would otherwise keep its lease renewed
  forever. Seen orphaned by two heartbeats in a row, it is released so any
  executor claims it at once, and the release counts as a crash: a run that
  keeps dying the same way is ended by ``max_recoveries``, not re-run forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from durably import errors, journal, loop_errors, operations, workflow_run
from durably.storage import thread

log = logging.getLogger("durably")


class Leases:
    """The heartbeat of one engine and what it learns.

    It is given what it needs of the engine, and nothing more: the store thread,
    the lease length and clock, the ids of the workflows the engine runs
    (``running``) and a way to make the engine look for work now (``kick``).
    """

    def __init__(
        self,
        store: thread.StoreThread,
        lease_seconds: float,
        clock: Callable[[], float],
        running: Callable[[], Collection[str]],
        kick: Callable[[], None],
    ) -> None:
        self._store = store
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._running = running
        self._kick = kick
        self._drivers: dict[workflow_run.Run, asyncio.Task[Any]] = {}
        self._orphans: dict[str, int] = {}

    def track(self, run: workflow_run.Run) -> None:
        """Note the task driving ``run`` (call from that task)."""
        task = asyncio.current_task()
        if task is not None:
            self._drivers[run] = task

    def untrack(self, run: workflow_run.Run) -> None:
        self._drivers.pop(run, None)

    async def heartbeat_loop(
        self, drained: asyncio.Event, me: journal.ExecutorInfo, stopping: asyncio.Event
    ) -> None:
        """Beat every ``lease_seconds / 3`` for executor ``me`` until ``drained`` is set.

        Not until the engine starts stopping: the runs still draining then keep
        their leases, so that no other executor starts their steps again. Once
        ``stopping`` is set it releases no orphan: a run that suspended for the
        stop holds its workflow, driven by nothing, until close() lets go of it
        cleanly, and must not be counted a crash meanwhile. An error other than the
        store's is logged (with its traceback once per kind) and the beats go on.
        """
        unexpected = loop_errors.LoopErrors("the heartbeat")
        while not drained.is_set():
            await operations.wait_event(drained, self._lease_seconds / 3)
            if drained.is_set():
                return
            try:
                await self.beat(me, release_orphans=not stopping.is_set())
            except errors.StoreError as exc:
                log.warning("heartbeat failed: %s", exc)
            except Exception as exc:  # a driver's OSError, a bug: beat again, never stop
                # No back-off of its own: the next beat is a third of a lease away, and a
                # later one could let the leases lapse.
                unexpected.failed(exc)
            else:
                unexpected.succeeded()

    async def beat(self, me: journal.ExecutorInfo, *, release_orphans: bool = True) -> None:
        """Renew every lease once; stop the runs that lost theirs; release orphans (unless
        ``release_orphans`` is False: the engine is stopping)."""
        call, store = self._store.call, self._store.store
        runs = list(self._drivers)  # every one of them was claimed before this heartbeat
        now = self._clock()
        held = dict(await call(store.heartbeat, me, now, now + self._lease_seconds, write=True))
        for run in runs:
            if not run.listening or held.get(run.workflow_id) == run.epoch:
                continue
            info = await call(store.get_workflow, run.workflow_id, write=False)
            ended = run.state is workflow_run.State.RETIRED
            if info is not None and info.epoch != run.epoch and not ended:
                self._lose(run, info.epoch, info.owner)
        if not release_orphans:
            self._orphans = {}
            return
        running = self._running()
        orphans = {wid: epoch for wid, epoch in held.items() if wid not in running}
        for wid, epoch in orphans.items():
            if self._orphans.get(wid) == epoch:
                log.error(
                    "workflow %s is held here but nothing runs it; releasing it as a crash", wid
                )
                await call(store.release, wid, epoch, self._clock(), True, write=True)
                self._kick()
        self._orphans = orphans

    def _lose(self, run: workflow_run.Run, epoch: int, owner: str | None) -> None:
        log.warning(
            "workflow %s was taken over (epoch %s, owner %s) while this executor held "
            "epoch %s; stopping its run",
            run.workflow_id,
            epoch,
            owner,
            run.epoch,
        )
        run.lose(
            errors.FencedError(
                f"workflow {run.workflow_id!r} is now at epoch {epoch} (owner {owner}); "
                f"this executor held epoch {run.epoch} and must stop"
            )
        )
        task = self._drivers.get(run)
        if task is not None:
            task.cancel()
