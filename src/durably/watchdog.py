"""A thread of the engine's own that keeps its leases while the event loop is blocked.

The heartbeat (:mod:`durably.leases`) runs on the event loop. An ``async def``
step that calls blocking code (``time.sleep``, a synchronous SDK, CPU-bound
work) stops the loop, and with it the heartbeat: the leases expire, another
executor takes the workflow over and runs the step again, blocks the same way
and loses it in turn. So the watchdog, a thread with a database connection of
its own, watches the loop: the loop ticks it every few tenths of a second.
When the loop has not ticked for ``threshold`` seconds (1 s, or a sixth of
the lease when that is shorter: the heartbeat may have beaten a third of a
lease before the loop stopped, and the renewal must land well before the
lease ends), the thread notes which step was running, and for as long as the
loop stays blocked it extends, every third of a lease, the leases of the runs
this executor drives -- each only at the epoch it holds and while it still
holds it: never a workflow that finished, parked, was released or was taken
over. When the loop ticks again it logs one warning naming the step and how
long it blocked, so that it can be made a ``def`` step.

It stops when the engine has drained (:meth:`Engine.close`), when its event loop
has ended, or with the process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

from durably import context, errors, journal
from durably.storage import base, create_store

log = logging.getLogger("durably")

#: Seconds without a tick after which the loop counts as blocked (at most a sixth of a lease).
BLOCKED_AFTER = 1.0

#: The async steps running now, by the task that runs each: read from the watchdog's thread
#: to name the step that blocks the loop (a plain dict: one lookup is atomic).
_STEPS: dict[asyncio.Task[object], context.StepContext] = {}


def async_step(ctx: context.StepContext, on_loop: bool = True) -> _Marked:
    """Mark the current task as running step ``ctx`` on the loop (to name it if it blocks).

    A step whose code runs in a thread (``on_loop=False``) cannot block the loop: not marked.
    """
    return _Marked(asyncio.current_task() if on_loop else None, ctx)


class _Marked:
    """The context manager of ``async_step`` (a plain class: it is entered on every step)."""

    __slots__ = ("_ctx", "_task")

    def __init__(self, task: asyncio.Task[object] | None, ctx: context.StepContext) -> None:
        self._task, self._ctx = task, ctx

    def __enter__(self) -> None:
        if self._task is not None:
            _STEPS[self._task] = self._ctx

    def __exit__(self, *exc_info: object) -> None:
        if self._task is not None:
            _STEPS.pop(self._task, None)


class Watchdog:
    """Watches one event loop from a thread; keeps the leases of ``held()`` while it is stuck.

    ``held`` returns the ``(workflow_id, epoch)`` of the runs the engine drives;
    it is called from the thread while the loop is blocked, when the engine's
    state cannot change under it.
    """

    def __init__(
        self,
        url: str,
        executor: journal.ExecutorInfo,
        lease_seconds: float,
        clock: Callable[[], float],
        held: Callable[[], Sequence[tuple[str, int]]],
    ) -> None:
        self._url = url
        self._executor = executor
        self._lease = lease_seconds
        self._clock = clock
        self._held = held
        self.threshold = min(BLOCKED_AFTER, lease_seconds / 6)
        self._tick_every = self.threshold / 4
        self._ticked = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: base.Store | None = None

    def start(self) -> None:
        """Begin ticking on the running loop and watching it from a new thread."""
        self._loop = asyncio.get_running_loop()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="durably-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (from the loop's thread); the thread closes its connection."""
        self._stop.set()
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (call from a thread that may block)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _tick(self) -> None:
        self._ticked = time.monotonic()
        if not self._stop.is_set():
            assert self._loop is not None
            self._tick_handle = self._loop.call_later(self._tick_every, self._tick)

    # --- the thread -----------------------------------------------------------------

    def _watch(self) -> None:
        poll = self._tick_every
        blocked_since: float | None = None
        blame = ""
        renewed = 0.0
        try:
            while not self._stop.wait(poll):
                assert self._loop is not None
                if self._loop.is_closed() or not self._loop.is_running():
                    return  # the loop ended without closing the engine: nothing runs here
                now, ticked = time.monotonic(), self._ticked
                if now - ticked < self.threshold:
                    if blocked_since is not None:
                        _warn(blame, ticked - blocked_since)
                        blocked_since = None
                    continue
                if blocked_since is None:
                    blocked_since, blame, renewed = ticked, self._blame(), 0.0
                if now - renewed >= self._lease / 3:
                    renewed = now
                    self._keep()
        finally:
            if self._store is not None:
                self._store.close()

    def _blame(self) -> str:
        """What the loop is running now: an async step, workflow code, or another task."""
        assert self._loop is not None
        try:
            task = asyncio.current_task(self._loop)
        except RuntimeError:
            task = None
        if task is None:
            return "a callback on the event loop (not a task)"
        step = _STEPS.get(task)
        if step is not None:
            return (
                f"async step {step.name!r} (workflow {step.workflow_id!r}, seq {step.seq}, "
                f"attempt {step.attempt})"
            )
        name = task.get_name()
        if name.startswith("durably:"):
            return f"the code of workflow {name[len('durably:') :]!r} (outside any step)"
        return f"task {name!r}"

    def _keep(self) -> None:
        """Extend the leases of the runs this executor drives, fenced by epoch."""
        try:
            held = list(self._held())
            if not held:
                return
            now = self._clock()
            if self._store is None:
                store = create_store(self._url)
                store.open()
                self._store = store
            op = base.Op(
                self._store.keep_leases, (self._executor, now, now + self._lease, held), True
            )
            self._store.run_batch([op])
            if op.error is not None:
                raise op.error
        except errors.StoreError as exc:
            log.warning("the watchdog could not keep the leases of a blocked loop: %s", exc)
        except Exception:
            log.exception("the watchdog could not keep the leases of a blocked loop")


def _warn(blame: str, seconds: float) -> None:
    log.warning(
        "%s blocked the event loop for %.1f s: durably kept its leases from a thread, but "
        "nothing else ran meanwhile (other workflows, timers, signals). Make it a plain "
        "`def` step, which runs in a thread, or await non-blocking calls instead "
        "(asyncio.to_thread for blocking ones).",
        blame,
        seconds,
    )
