"""The threads sync steps run on, and the CPU a quick one runs on.

A sync ``def`` step runs on a step thread, so that however long it blocks, the event
loop goes on. When nothing else is ready on the loop, the loop's thread waits for a
quick step itself (``step_call._call``): the step is then two thread wake-ups, one
each way. Across two CPUs each wake-up is an interrupt to the other CPU and a thread
that starts on cold caches, about 25 µs each on the development VM; on the waiting
thread's own CPU it is a switch between two threads, about 10 µs in all. So a step the
loop's thread waits for (``near=True``) runs on a thread kept on that thread's CPU
(Linux; ``sched_setaffinity``), which is idle while it waits. A step that outlasts
the wait is let go (``let_go``): its thread may run on any CPU again, beside the loop.

The pool is ours and not ``concurrent.futures.ThreadPoolExecutor`` because the thread
that takes a step must be known before it wakes: each thread has a queue of its own,
and the idle ones are reused newest first (the warmest caches). Threads are made as
needed up to ``size``; beyond that steps wait in turn. They are daemon threads: a
process that exits while a sync step still runs cuts it off as a crash would (its
step runs again when the workflow is recovered), instead of hanging on it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("durably.step_threads")

#: A step to run and the future its outcome goes to; None tells a thread to end.
_Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


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
    """One step thread: its own queue, and the CPU it is kept on (None: any it may use)."""

    __slots__ = ("home", "jobs", "pinned", "thread", "tid")

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.pinned: int | None = None
        self.tid = 0  # the kernel's id of the thread, once it runs
        self.home: set[int] = set()  # the CPUs it may use when not kept on one
        self.thread: threading.Thread | None = None


class StepThreads:
    """Up to ``size`` threads for sync steps; one the loop's thread waits for runs on its CPU.

    ``place=False`` never moves a thread (what the pool falls back to when the system
    refuses to, once, with a log line).
    """

    def __init__(self, size: int, name: str = "durably-step", *, place: bool = True) -> None:
        self._size = size
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # newest last: taken first
        self._workers: list[_Worker] = []
        self._waiting: collections.deque[_Job] = collections.deque()  # when all are busy
        self._near: dict[concurrent.futures.Future[Any], _Worker] = {}
        self._closed = False
        self._place = place
        self._cpu: Callable[[], int] | None = None
        self._cpu_read = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, near: bool = False
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on a step thread; its outcome goes to the future returned.

        ``near``: the calling thread will wait for it (and do nothing else meanwhile):
        the thread that takes it runs it on the caller's CPU until ``let_go``.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        job: _Job = (future, (lambda: fn(*args)) if args else fn)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a step on the step threads after they shut down")
            if self._idle:
                worker = self._idle.pop()
            elif len(self._workers) < self._size:
                worker = self._start_worker()
            else:
                self._waiting.append(job)  # the next thread to finish takes it (anywhere)
                return future
            if near and self._place:
                self._near[future] = worker
        self._put_on(worker, near)
        worker.jobs.put(job)
        return future

    def let_go(self, future: concurrent.futures.Future[Any]) -> None:
        """The caller stopped waiting for ``future``'s step: its thread may use any CPU."""
        with self._lock:
            worker = self._near.pop(future, None)
        if worker is not None:
            self._put_on(worker, False)

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

    # --- placing a thread ---------------------------------------------------------

    def _put_on(self, worker: _Worker, near: bool) -> None:
        """Keep ``worker`` on the calling thread's CPU (``near``), or let it use its own."""
        if not self._place or (not near and worker.pinned is None):
            return
        cpu = self._current_cpu() if near else None
        if cpu is not None and cpu < 0:
            return
        if cpu == worker.pinned:
            return
        try:
            os.sched_setaffinity(worker.tid, worker.home if cpu is None else {cpu})
        except OSError as exc:  # a sandbox that refuses, a CPU taken from the set meanwhile
            self._place = False
            log.info("step threads stay where the system puts them: %s", exc)
            return
        worker.pinned = cpu

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
        n = len(self._workers)
        thread = threading.Thread(
            target=self._serve, args=(worker, started), name=f"{self._name}_{n}", daemon=True
        )
        worker.thread = thread
        self._workers.append(worker)
        thread.start()
        started.wait()
        return worker

    def _serve(self, worker: _Worker, started: threading.Event) -> None:
        worker.tid = threading.get_native_id()
        if hasattr(os, "sched_getaffinity"):
            worker.home = os.sched_getaffinity(0)
        started.set()
        try:
            while True:
                job = worker.jobs.get()
                if job is None:  # shut down while idle
                    return
                while job is not None:
                    future = job[0]
                    outcome = _run(*job)
                    with self._lock:
                        self._near.pop(future, None)
                        job = self._waiting.popleft() if self._waiting else None
                        if job is None and not self._closed:
                            self._idle.append(worker)  # before the outcome: the next step
                    _deliver(future, outcome)  # may take this thread at once
                    if job is None and self._closed:
                        return
        finally:
            with self._lock:
                if worker in self._workers:
                    self._workers.remove(worker)


def _run(future: concurrent.futures.Future[Any], fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Run one step: (True, its result) or (False, what it raised); (True, None) if the
    future was cancelled before it began (it is not run)."""
    if not future.set_running_or_notify_cancel():
        return True, None
    try:
        return True, fn()
    except BaseException as exc:  # as concurrent.futures does: the caller raises it
        return False, exc


def _deliver(future: concurrent.futures.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.cancelled():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
