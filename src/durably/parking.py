"""How a run waits and parks: its waits (blocks), its work in progress, and the park.

A wait that finds nothing blocks in :meth:`Parking.block`; once no step or
commit of the run is on its way and every branch is blocked, the hold runs out
and the run parks (``Run.write("park")``): its row says ``sleeping``,
``waiting`` or ``needs_review``, and its waits unwind with Suspended. A part of
:class:`durably.workflow_run.Run`, kept here so that the run's module holds its
write path and its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from durably import errors, journal, runstate
from durably.run_types import REVIEW, Abandoned, Block, Services, Suspended

State = runstate.State


class Parking:
    """Run methods that wait and park; the Run supplies what is declared here."""

    _services: Services
    _state: State
    _resume: State
    _blocks: list[Block]
    pokes: int
    _idle: asyncio.Event
    _settled: asyncio.Event
    _park_timer: asyncio.TimerHandle | None
    _park_task: asyncio.Task[None] | None
    inflight: int

    @property
    def listening(self) -> bool:
        raise NotImplementedError

    @property
    def _parking(self) -> bool:
        raise NotImplementedError

    def suspend(self, why: str) -> Suspended:
        raise NotImplementedError

    async def write(self, verb: Any, *args: Any, internal: bool = False) -> Any:
        raise NotImplementedError

    def active(self) -> contextlib.AbstractContextManager[None]:
        """Mark work in progress: a run with work in progress never parks.

        The run is its own context manager: no generator (every step enters it twice,
        its call and its commit) and no object holding the run's methods, whose
        reference back to the run made every run garbage only the cyclic collector
        could free (6-8% of a busy engine's time went to collections).
        """
        return self

    def __enter__(self) -> None:
        self._busier()

    def __exit__(self, *exc_info: object) -> None:
        self._done_with()

    def _done_with(self) -> None:
        """The end of a stretch of ``active()`` work: park if only waits are left."""
        self._calmer()
        if self.inflight == 0 and self._blocks:
            self._schedule_park()

    def _busier(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def _calmer(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    @contextlib.contextmanager
    def not_active(self) -> Iterator[None]:
        """Inside ``active()``, mark a stretch that only waits (a step parked for review)."""
        self._calmer()
        try:
            yield
        finally:
            self._busier()

    async def wait_idle(self) -> None:
        """Wait until no step or commit of this run is on its way."""
        await self._idle.wait()

    async def block(
        self, kind: str, key: str, wake_at: float | None, since: int | None = None
    ) -> None:
        """Wait until poked, until ``wake_at``, or until the run parks (raises Suspended).

        ``since``: the count of pokes when the caller last looked at the store; a poke
        after that look (it found no block to wake) returns at once, so that it is not lost.
        """
        if not self.listening:
            raise self.suspend("this run has let go of the workflow")
        if since is not None and since != self.pokes:
            return
        loop = asyncio.get_running_loop()
        block = Block(loop.create_future(), kind, key, wake_at)
        self._blocks.append(block)
        timer = None
        if wake_at is not None:
            timer = loop.call_later(max(0.0, wake_at - self._services.clock()), _wake, block.future)
        if self.inflight == 0:
            self._schedule_park()
        try:
            await block.future
        finally:
            self._blocks.remove(block)
            if timer is not None:
                timer.cancel()
            # The Suspended the park raises is held by the block's future; this frame,
            # which its traceback holds, must not hold the block back (a cycle only the
            # cyclic collector frees, with the run in it).
            del block

    def poke(self, kind: str | None = None, key: str | None = None) -> None:
        """Wake the waits of this run (all, or those for one signal or child) to re-check."""
        self.pokes += 1  # counted for a wait between its look and its block (``block``)
        for block in list(self._blocks):
            if kind is None or (block.kind == kind and block.key == key):
                _wake(block.future)

    def _schedule_park(self) -> None:
        if self._park_timer is not None or self._state is State.PARKED or self._parking:
            return
        wakes = [b.wake_at for b in self._blocks]
        now = self._services.clock()
        urgent = self._services.stopping.is_set() or any(b.kind == REVIEW for b in self._blocks)
        hold = 0.0 if urgent else self._services.hold_seconds
        if wakes and all(w is not None and w - now <= hold for w in wakes):
            return  # every wait ends soon: cheaper to stay than to park and replay
        self._park_timer = asyncio.get_running_loop().call_later(hold, self._start_park)

    def _start_park(self) -> None:
        self._park_timer = None
        if not self.listening or self.inflight or not self._blocks or self._parking:
            return
        if self._state in (State.RUNNING, State.CLOSING):
            self._resume, self._state = self._state, State.PARKING
        self._settled.clear()
        planned = list(self._blocks)
        self._park_task = asyncio.get_running_loop().create_task(self._park(planned))

    async def _park(self, planned: list[Block]) -> None:
        try:
            await self._park_now(planned)
        finally:
            if self._state is State.PARKING:  # the park did not happen: go on as before
                self._state = self._resume
            self._settled.set()
            # kept only while it runs: its context holds the run (a cycle once done)
            self._park_task = None
            # A wait that blocked again while this park was on its way scheduled none
            # (_schedule_park skips while parking): if only waits are left, hold anew.
            if self.listening and self.inflight == 0 and self._blocks:
                self._schedule_park()

    async def _park_now(self, planned: list[Block]) -> None:
        waits = list(self._blocks)
        # A wait woken on the way here (a poke in the same loop iteration as the hold
        # running out) may already have left the list: parking without it would watch
        # neither its signal nor its child. Its branch looks again once this settles,
        # and blocks anew (scheduling the next park) if there is still nothing.
        if any(b.future.done() or all(b is not w for w in waits) for b in planned):
            return
        if any(b.kind == REVIEW for b in waits):
            status = journal.Status.NEEDS_REVIEW
        elif any(b.kind != journal.Kind.SLEEP for b in waits):
            status = journal.Status.WAITING
        else:
            status = journal.Status.SLEEPING
        wake_at = min((b.wake_at for b in waits if b.wake_at is not None), default=None)
        signals = sorted({b.key for b in waits if b.kind == journal.Kind.SIGNAL})
        children = sorted({b.key for b in waits if b.kind == journal.Kind.JOIN})
        pokes = self.pokes
        try:
            parked = await self.write("park", status, wake_at, signals, children, internal=True)
        except (errors.FencedError, Abandoned):
            parked = True  # nothing more can be written: let the waits unwind
        except errors.StorageDataError as exc:
            # A value journaled on the way (an event, say) was refused and is dropped:
            # the waits raise it into the workflow's code, which fails with it (or goes on).
            for block in waits:
                if not block.future.done():
                    block.future.set_exception(exc)
            return
        if not parked:  # a signal or a child arrived meanwhile (entries are written): look again
            self.poke()
            return
        self._state = State.PARKED
        if self.pokes != pokes or any(b.future.done() for b in waits):
            # Woken while the park was on its way: what woke it (a signal, a child's end)
            # came after the park's look, so the parked workflow is due now; the wake-up
            # went to these waits, which no longer act on it: look for it from here.
            wake_at = self._services.clock()
        # Every wait unwinds, not only those listed: one woken on the way (the engine
        # stopping pokes them all) that blocked again is a new wait, as parked as these.
        for block in list(self._blocks):
            if not block.future.done():
                block.future.set_exception(self.suspend(f"parked {status}"))
        self._services.on_park(wake_at)

    async def close(self) -> None:
        """The workflow function ended: start nothing new, let running steps commit."""
        if self._state is State.RUNNING:
            self._state = State.CLOSING
        elif self._state is State.PARKING:
            self._resume = State.CLOSING
        await self.wait_idle()

    def retire(self) -> None:
        """The workflow task ended: refuse every later write of this run."""
        if self._state is not State.PARKED:
            self._state = State.RETIRED
        if self._park_timer is not None:
            self._park_timer.cancel()
            self._park_timer = None


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
