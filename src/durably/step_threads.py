"""The threads sync steps run on, and the CPU a quick one is woken on.

A sync ``def`` step runs on a step thread, so that however long it blocks, the event
loop goes on. When nothing else is ready on the loop, the loop's thread waits for a
quick step itself (``step_call._call``): the step is then two thread wake-ups, one
each way. Across two CPUs a wake-up is an interrupt to the other CPU and a thread
that resumes on cold caches (a bare hand-off and back: 54 µs on the development VM,
against 21 µs with both threads on one CPU). So the thread that takes a step the
caller will wait for (``near=True``) is woken on the caller's CPU, which the caller
leaves idle while it waits: it is kept there (Linux, ``sched_setaffinity``) only
until it wakes, and the first thing it does is take back every CPU it may use,
before the step's code runs. A step therefore never runs kept on one CPU, and a
thread or process it starts inherits the thread's own CPUs, not the one.

The pool is ours and not ``concurrent.futures.ThreadPoolExecutor`` because the thread
that takes a step must be known before it wakes: each thread has a queue of its own,
and the idle ones are reused newest first (the warmest caches). A step its caller
holds for (``hand``) comes back through one lock the caller blocks on, not a
``concurrent.futures.Future`` (whose condition variable costs 10-15 µs of Python a
hand-off on the development VM); it becomes one only if the caller stops holding.
Threads are made as needed up to ``size``; beyond that steps wait in turn. They are
daemon threads: a process that exits while a sync step still runs cuts it off as a
crash would (its step runs again when the workflow is recovered), instead of hanging
on it.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("durably.step_threads")

#: What a step did: (True, its result) or (False, what it raised).
_Outcome = tuple[bool, Any]


class _Submitted:
    """A step whose outcome goes to a ``concurrent.futures.Future`` (``submit``)."""

    __slots__ = ("fn", "future", "kept")

    def __init__(self, fn: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
        self.fn = fn
        self.future = future
        self.kept = False  # its thread was kept on one CPU to be woken there

    def begin(self) -> bool:
        """False if it was cancelled before it began: it is not run."""
        return self.future.set_running_or_notify_cancel()

    def finish(self, outcome: _Outcome) -> None:
        _deliver(self.future, outcome)


class Handed:
    """A step handed to a step thread while its caller holds for it (``StepThreads.hand``).

    The caller blocks in ``wait`` on a lock the step's thread releases when the step
    returns. If the caller stops holding first, it lets the step go: ``future`` (a
    ``concurrent.futures.Future``) or ``StepThreads.let_go`` (an asyncio future, set
    through the loop's mailbox), and the thread delivers there instead. ``_lock``
    orders the two: the outcome goes to exactly one.
    """

    __slots__ = ("_began", "_done", "_later", "_lock", "_outcome", "fn", "kept")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.kept = False
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released once the outcome is here, while held
        self._lock = _thread.allocate_lock()
        self._later: _Submitted | _Awaited | None = None  # where it goes once let go
        self._outcome: _Outcome | None = None
        self._began = False

    def wait(self, seconds: float) -> bool:
        """True if the step finished within ``seconds`` (this thread blocks, the GIL let go)."""
        return self._done.acquire(True, seconds)

    def result(self) -> Any:
        """The step's result, or raise what it raised; once, after ``wait`` returned True."""
        outcome, self._outcome = self._outcome, None  # an error's traceback holds this frame
        if outcome is None:
            raise RuntimeError("a handed step's result was read before it finished, or twice")
        ok, value = outcome
        if ok:
            return value
        try:
            raise value
        finally:
            del value, outcome  # nor a cycle through the traceback's frame and its locals

    def future(self) -> concurrent.futures.Future[Any]:
        """The step's outcome as a future, for a caller that stopped holding (once)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.let_go(_Submitted(self.fn, future))
        return future

    def let_go(self, later: _Submitted | _Awaited) -> None:
        """Deliver the outcome to ``later`` instead (once): now if it is here already."""
        with self._lock:
            if self._later is not None:
                raise RuntimeError("a handed step was let go of twice")
            outcome = self._outcome
            if outcome is None:
                if self._began:
                    later.begin()  # (a future made running: it can no longer be cancelled)
                self._later = later
                return
        later.begin()
        later.finish(outcome)

    def begin(self) -> bool:
        with self._lock:
            self._began = True
            later = self._later
        return later is None or later.begin()

    def finish(self, outcome: _Outcome) -> None:
        with self._lock:
            later = self._later
            if later is None:
                self._outcome = outcome
                self._done.release()
                return
        later.finish(outcome)


class _Mailbox:
    """Outcomes of steps on their way to one event loop's futures: a step's thread posts
    its outcome, and the first post since the loop last emptied the box asks the loop
    (one ``call_soon_threadsafe``: a write to its self-pipe) to set them all."""

    __slots__ = ("_items", "_lock", "_posted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = _thread.allocate_lock()
        self._items: list[tuple[asyncio.Future[Any], _Outcome]] = []
        self._posted = False

    def post(self, future: asyncio.Future[Any], outcome: _Outcome) -> None:
        with self._lock:
            self._items.append((future, outcome))
            if self._posted:
                return
            self._posted = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for these
            self.loop.call_soon_threadsafe(self._empty)

    def _empty(self) -> None:
        with self._lock:
            items, self._items, self._posted = self._items, [], False
        for future, (ok, value) in items:
            if future.done():  # its caller was cancelled meanwhile
                continue
            try:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            except Exception as exc:  # a value a future refuses: the rest are set still
                log.exception("a sync step's outcome could not be handed to its caller")
                future.set_exception(RuntimeError(f"a sync step's outcome was refused: {exc}"))


class _Awaited:
    """A step whose outcome goes to an asyncio future, through its loop's mailbox
    (``StepThreads.run``); not run if that future was cancelled before it began."""

    __slots__ = ("fn", "future", "kept", "mailbox")

    def __init__(
        self, fn: Callable[[], Any], future: asyncio.Future[Any], mailbox: _Mailbox
    ) -> None:
        self.fn = fn
        self.future = future
        self.mailbox = mailbox
        self.kept = False

    def begin(self) -> bool:
        return not self.future.cancelled()  # (read across threads: at worst it runs)

    def finish(self, outcome: _Outcome) -> None:
        self.mailbox.post(self.future, outcome)


#: A step to run (a thread's queue also takes None, which tells it to end).
_Job = _Submitted | Handed | _Awaited


def _current_cpu_reader() -> Callable[[], int] | None:
    """The C library's ``sched_getcpu`` (the calling thread's CPU, about 0.2 µs), or None
    where the threads cannot be placed (not Linux, no such function)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes  # here: only a process that runs a sync step pays its import

        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


class _Worker:
    """One step thread and its own queue."""

    __slots__ = ("home", "jobs", "thread", "tid")

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.tid = 0  # the kernel's id of the thread, once it runs
        self.home: set[int] = set()  # the CPUs it may use (when not kept on one to wake)
        self.thread: threading.Thread | None = None


class StepThreads:
    """Up to ``size`` threads for sync steps; one the caller waits for is woken on its CPU.

    Where the system refuses to place a thread, the pool stops trying, with one log
    line. ``cpu`` says which CPU the caller is on: the C library's ``sched_getcpu``
    unless given (a test names one).
    """

    def __init__(
        self,
        size: int,
        name: str = "durably-step",
        *,
        cpu: Callable[[], int] | None = None,
    ) -> None:
        self._size = size
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # newest last: taken first
        self._workers: list[_Worker] = []
        self._waiting: collections.deque[_Job] = collections.deque()  # when all are busy
        self._closed = False
        self._place = hasattr(os, "sched_setaffinity")  # (Linux) until the system refuses
        self._cpu = cpu
        self._cpu_read = cpu is not None
        self._mailbox: _Mailbox | None = None  # for the loop that last called run()

    def submit(
        self, fn: Callable[..., T], /, *args: Any, near: bool = False
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on a step thread; its outcome goes to the future returned.

        ``near``: the calling thread will wait for it (and do nothing else meanwhile):
        an idle thread that takes it is woken on the caller's CPU (with every thread
        busy, the step waits its turn and is woken anywhere).
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._give(_Submitted((lambda: fn(*args)) if args else fn, future), near)
        return future

    def run(self, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on a step thread; its outcome goes to the asyncio future
        returned, on the calling thread's running loop. Cancelling the future before the
        step began keeps it from running. Outcomes that arrive together reach the loop
        through one wake-up (``_Mailbox``), not one each."""
        mailbox = self._mailbox_here()
        future: asyncio.Future[Any] = mailbox.loop.create_future()
        self._give(_Awaited((lambda: fn(*args)) if args else fn, future, mailbox), False)
        return future

    def let_go(self, handed: Handed) -> asyncio.Future[Any]:
        """A handed step its caller stops holding for: its outcome goes to the asyncio
        future returned, as ``run``'s do."""
        mailbox = self._mailbox_here()
        future: asyncio.Future[Any] = mailbox.loop.create_future()
        handed.let_go(_Awaited(handed.fn, future, mailbox))
        return future

    def _mailbox_here(self) -> _Mailbox:
        """The mailbox of the running loop (an engine's pool serves one loop)."""
        loop = asyncio.get_running_loop()
        mailbox = self._mailbox
        if mailbox is None or mailbox.loop is not loop:
            mailbox = self._mailbox = _Mailbox(loop)
        return mailbox

    def hand(self, fn: Callable[..., Any], /, *args: Any) -> Handed:
        """Run ``fn(*args)`` on a step thread, for a caller that holds for it:
        ``Handed.wait``, then ``result`` (or ``future``). An idle thread is woken on this
        thread's CPU; with every thread busy the step waits its turn, woken anywhere."""
        handed = Handed((lambda: fn(*args)) if args else fn)
        self._give(handed, True)
        return handed

    def _give(self, job: _Job, near: bool) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a step on the step threads after they shut down")
            if self._idle:
                worker = self._idle.pop()
            elif len(self._workers) < self._size:
                worker = self._start_worker()
            else:
                self._waiting.append(job)  # the next thread to finish takes it
                return
        try:
            job.kept = near and self._keep_on_this_cpu(worker)
        finally:  # the thread left the idle ones: it gets its step, whatever happened
            worker.jobs.put(job)

    def shutdown(self) -> None:
        """No more steps; idle threads end now, busy ones once the steps waiting are run."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.jobs.put(None)

    def threads(self) -> list[threading.Thread]:
        """The step threads that were started and have not ended (for tests and tools)."""
        with self._lock:
            return [w.thread for w in self._workers if w.thread is not None and w.thread.is_alive()]

    # --- waking a thread on this CPU ---------------------------------------------

    def _keep_on_this_cpu(self, worker: _Worker) -> bool:
        """Keep ``worker`` on the calling thread's CPU until it wakes; False if not kept."""
        try:
            cpu = self._current_cpu() if self._place else None
            if cpu is None or cpu < 0:
                return False
            os.sched_setaffinity(worker.tid, {cpu})
        except Exception as exc:  # a sandbox that refuses, a CPU taken from the set meanwhile
            self._place = False
            log.info("step threads are woken where the system puts them: %s", exc)
            return False
        return True

    def _current_cpu(self) -> int | None:
        if not self._cpu_read:
            self._cpu, self._cpu_read = _current_cpu_reader(), True
            if self._cpu is None:
                self._place = False
        return None if self._cpu is None else self._cpu()

    # --- the threads --------------------------------------------------------------

    def _start_worker(self) -> _Worker:
        """A new thread, running once it knows its own id (called holding the lock)."""
        worker = _Worker()
        started = threading.Event()
        worker.thread = threading.Thread(
            target=self._serve,
            args=(worker, started),
            name=f"{self._name}_{len(self._workers)}",
            daemon=True,
        )
        worker.thread.start()  # (a system out of threads raises here, and nothing is kept)
        self._workers.append(worker)
        started.wait()
        return worker

    def _serve(self, worker: _Worker, started: threading.Event) -> None:
        try:
            try:
                worker.tid = threading.get_native_id()
                worker.home = os.sched_getaffinity(0) if self._place else set()
            except Exception as exc:  # the system will not say: this thread is never moved
                self._place = False
                log.info("step threads are woken where the system puts them: %s", exc)
            finally:
                started.set()
            while True:
                job = worker.jobs.get()
                if job is None:  # shut down while idle
                    return
                while job is not None:
                    if job.kept:  # woken on the caller's CPU: every CPU again, before the step
                        _take_back(worker.home)
                    # a step whose caller was cancelled before it began: neither run nor told
                    outcome = _run(job.fn) if job.begin() else None
                    done, job = job, None
                    with self._lock:  # what comes next is decided here, and only here:
                        job = self._waiting.popleft() if self._waiting else None
                        end = job is None and self._closed  # (a shutdown after this finds
                        if job is None and not end:  # the thread idle and tells it)
                            self._idle.append(worker)  # before the outcome: the next step
                    if outcome is not None:
                        done.finish(outcome)  # may take this thread at once
                    # idle, hold nothing of the step: its result, or its context and with
                    # it the run, whose end would wait for this thread's next step
                    del done, outcome
                    if end:
                        return
        finally:
            with self._lock:
                if worker in self._workers:
                    self._workers.remove(worker)


def _take_back(cpus: set[int]) -> None:
    """Let the calling thread run on ``cpus`` again (after it was woken kept on one)."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # none of them is allowed any more (the set was changed)
        log.info("a step thread stays on the CPU it was woken on: %s", exc)


def _run(fn: Callable[[], Any]) -> _Outcome:
    """Run one step: (True, its result) or (False, what it raised). A StopIteration
    becomes a RuntimeError, as in a coroutine: a future refuses one (``TypeError``), and
    the caller would wait for its outcome for ever."""
    try:
        return True, fn()
    except StopIteration as exc:
        error = RuntimeError(f"a sync step raised StopIteration: {exc!r}")
        error.__cause__ = exc
        return False, error
    except BaseException as exc:  # as concurrent.futures does: the caller raises it
        return False, exc


def _deliver(future: concurrent.futures.Future[Any], outcome: _Outcome) -> None:
    """Hand a step's outcome to its future. Its callbacks run here: one that raises past
    what ``concurrent.futures`` catches (a BaseException) is logged, not let end the thread."""
    if future.cancelled():
        return
    ok, value = outcome
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except BaseException:  # a callback's, not the step's: the step's outcome is set
        log.exception("a callback of a step's future raised")
