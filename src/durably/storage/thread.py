"""The store's threads, which run every storage call, committing in groups.

The engine is asyncio; the stores are synchronous. A call is queued to the store
thread, which drains whatever is waiting and runs it in one transaction, so
concurrent workflows share one commit (group commit) and the event loop does not
wait for a lock or a slow disk. A store that can use several connections
(PostgreSQL, ``Store.threads``) gets as many threads, taking batches from the one
queue: while one waits for its COMMIT, the next batch runs on another connection.
Two exceptions save the threads' wake-ups: a commit made while the loop is quiet
runs at once on its thread, and on SQLite the commits made while it is busy are
gathered and run together on its thread at its next turn. See docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from durably import errors
from durably.storage import base, marks

T = TypeVar("T")

log = logging.getLogger("durably")

#: How many times an op runs whose transaction the database keeps undoing to end a
#: deadlock (``errors.TransactionConflict``) before its caller hears of it.
CONFLICT_TRIES = 5

#: Seconds before an undone op runs again, times its tries so far: the transaction that
#: won needs a moment to commit, and an op that ran again at once could take the first of
#: its rows ahead of it and meet it in a second deadlock (a second's wait each).
CONFLICT_PAUSE = 0.01

_STOP = object()

#: The longest a run of inline commits keeps the event loop to itself (seconds): then it
#: yields once, so timers and I/O of everything else on the loop are served.
_BREATHE_EVERY = 0.001

#: The longest the event loop's thread waits for a store call (or a sync step) itself,
#: when nothing else is ready on the loop, before it awaits it as any other future.
HOLD_LOOP = 0.001

#: A gathered batch that held the event loop's thread longer than this (seconds: a disk
#: that stalled in its fsync) sends the calls of a while after it to the store thread
#: (``pause_after``): a stall holds the loop once, not at every batch.
GATHER_SLOW = 0.02


def stalled(url: str, what: str, then: str, began: float, took: float, pause: float) -> float:
    """Log that ``what`` held the event loop's thread ``took`` seconds, so that for
    ``pause`` seconds ``then``; the time that pause ends."""
    log.info(
        "%s: %s on the event loop's thread took %.0f ms; for %.0f s %s",
        url,
        what,
        took * 1000,
        pause,
        then,
    )
    return began + took + pause


def pause_after(
    took: float, factor: float = 30.0, least: float = 1.0, most: float = 300.0
) -> float:
    """Seconds of calls through the store threads after a call on the event loop's thread
    that took ``took``: ``factor`` times as long, from ``least`` to ``most``, so the loop
    spends at most about a ``factor``-th of its time in stalled calls."""
    return min(most, max(least, took * factor))


def done_within(future: concurrent.futures.Future[Any], seconds: float) -> bool:
    """True if ``future`` finished (with a result or an error) within ``seconds``.

    Blocks this thread, the GIL released, so the thread that runs it goes on meanwhile.
    """
    try:
        future.exception(timeout=seconds)  # raises TimeoutError only if not done
    except TimeoutError:
        return False
    return True


def loop_is_quiet() -> bool:
    """True when no other callback waits to run on this event loop.

    Then committing here costs the loop nothing, and saves the two thread
    wake-ups of the store thread; when others are ready, their commits should
    share one transaction (group commit), gathered for the loop's next turn
    (SQLite) or on the store thread. Reads the ready queue of asyncio's own loop;
    on other loops it is never quiet.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    return ready is not None and len(ready) == 0


class StoreThread:
    """Runs a Store's verbs on dedicated threads (``store.threads``), batching concurrent
    calls. With one thread calls commit in the order they were queued; with several, a
    caller that needs an order between two calls awaits the first before the second."""

    def __init__(self, store: base.Store, *, max_batch: int = 128) -> None:
        self.store = store
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._exec = threading.Lock()  # one thread: whoever runs verbs holds it (or inline)
        self._alone = store.threads <= 1
        self._gate = _Gate()
        self._breathed = 0.0  # time.monotonic() when an inline commit last yielded the loop
        # Calls queued and not yet answered (under _lock): an inline call runs only when
        # there are none, so it never commits ahead of a call made before it.
        self._pending = 0
        # Calls made while the loop was busy, run together on its thread at its next turn
        # (``_flush``); a call queued to the threads first queues these, made before it.
        self._gathered: list[tuple[base.Op, asyncio.Future[Any]]] = []
        self._gather_loop: asyncio.AbstractEventLoop | None = None
        self._gather_paused_until = 0.0

    def start(self) -> None:
        """Open the store on a thread and begin serving. Raises what open raised."""
        with self._lock:
            if self._threads:
                return
            self._threads = [self._spawn(0)]
        try:
            self.call_sync(self.store.open, write=True, _raw=True)
        except BaseException:
            self.stop()
            raise
        with self._lock:  # the others connect on their first batch
            if self._threads:
                self._threads += [self._spawn(i) for i in range(1, self.store.threads)]

    def _spawn(self, i: int) -> threading.Thread:
        name = "durably-store" if i == 0 else f"durably-store-{i}"
        thread = threading.Thread(target=self._serve, args=(i > 0,), name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Finish queued calls, close the store and end the threads."""
        with self._lock:
            threads, self._threads = self._threads, []
            if not threads:
                return
            if self._gathered:  # made before the stop: finished as queued calls are
                self._enqueue(self._gathered)
                self._gathered = []
            self._queue.put(_STOP)  # under the lock: nothing can be queued behind it
        for thread in threads:
            thread.join()
        with contextlib.suppress(queue.Empty):  # the stop each thread passed on: nothing else
            while True:
                self._queue.get_nowait()
        self._close()

    def submit(
        self, fn: Callable[..., T], *args: Any, write: bool = True, _raw: bool = False
    ) -> concurrent.futures.Future[T]:
        """Queue a verb; the future holds its result or its error."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(base.Op(fn, args, write), future, _raw)
        return future

    async def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        write: bool = True,
        inline: bool = False,
        then: Callable[[T], None] | None = None,
    ) -> T:
        """Await a verb run on the store thread.

        The result comes back through one ``call_soon_threadsafe`` per batch and
        loop, the cheapest hand-off asyncio offers (see benchmarks/). With
        ``inline``, when the thread is idle and the store can commit without
        waiting for a lock, the verb runs here instead: on a small machine the
        two thread wake-ups cost more than the commit (docs/decisions.md); with
        the thread idle but no commit here, this thread waits for it up to
        ``HOLD_LOOP``. With other calls pending it is queued as any call. A run
        of inline commits yields to the loop once a millisecond (``_BREATHE_EVERY``),
        not after each: a loop iteration costs as much as the rest of a step's
        Python on SQLite NORMAL, and the loop was quiet when each commit began.

        With ``inline`` while other callbacks are ready on the loop, a store that gathers
        (``Store.gathers_inline``: SQLite) takes the call into the batch the loop's
        thread runs at its next turn, in one transaction (``_flush``): the group commit
        of a busy loop, without the store thread's two wake-ups and its share of the
        interpreter lock. Otherwise it goes to the store thread, as any call. Calls made
        on the loop's thread keep their order either way; one made from another thread
        while a gathered batch runs is concurrent with it, and may commit first.

        ``then``, given, is called on the loop's thread with the result once the verb
        has run, even if the caller is cancelled meanwhile (the call is then not taken
        back): what must follow a commit (a start's launch) cannot be lost with the
        caller. It runs before the caller resumes, and what it schedules runs after.
        """
        if inline and not self._pending and not loop_is_quiet():
            if self.store.gathers_inline and not marks.runs_alone(fn):
                gathered = self._gather(base.Op(fn, args, write))
                if gathered is not None:
                    return await _answer(gathered, then)
        elif inline and not self._pending and not self._gathered:  # (another loop's)
            op = base.Op(fn, args, write)
            if not marks.runs_alone(fn) and self._run_inline(op):
                if then is not None or time.monotonic() - self._breathed >= _BREATHE_EVERY:
                    await self._breathe(None if op.error else then, op.result)
                if op.error is not None:
                    raise op.error
                return op.result  # type: ignore[no-any-return]
            # Not here (a server's round trip, a lock held): the loop is quiet and the store
            # threads idle, so its thread waits for the store thread itself a while, woken by
            # it directly instead of through the loop (a self-pipe, a poll and a loop
            # iteration). Not while other calls are pending: this one would wait behind
            # them, and their answers, queued on the loop meanwhile, with it.
            held: concurrent.futures.Future[T] = concurrent.futures.Future()
            self._put(op, held, False)
            if done_within(held, HOLD_LOOP):
                result = held.result()
                await self._breathe(then, result)
                return result
            return await _answer(asyncio.wrap_future(held), then)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put(base.Op(fn, args, write), (loop, future), False)
        return await _answer(future, then)

    def _gather(self, op: base.Op) -> asyncio.Future[Any] | None:
        """Take ``op`` into the batch of this loop's next turn: the future of its answer.
        None, having taken nothing, while gathering pauses after a slow batch, once the
        store is closed, or while another loop's calls are gathered (the store thread
        takes it then)."""
        if time.monotonic() < self._gather_paused_until:
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if not self._threads:
                return None
            if not self._gathered:
                self._gather_loop = loop
                loop.call_soon(self._flush, loop)
            elif self._gather_loop is not loop:
                return None
            self._gathered.append((op, future))
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the calls ``loop`` gathered since its last turn (at most ``max_batch``; the
        rest at its next), in one transaction on its thread; those the store refuses (a
        lock held by another process) go to the store thread, which waits for the lock.
        Callers hear in the order they called."""
        with self._lock:
            if self._gather_loop is not loop:  # queued meanwhile; another loop's now
                return
            items = self._gathered[: self._max_batch]
            del self._gathered[: self._max_batch]
            if self._gathered:
                loop.call_soon(self._flush, loop)
            if self._pending:  # queued before these were made: they go behind
                self._enqueue(items)
                return
        live = [(op, future) for op, future in items if not future.cancelled()]
        if not live:
            return
        ops = base.lock_order([op for op, _ in live])
        began = time.monotonic()
        try:
            ran = dict(zip(map(id, ops), self._run_inline_batch(ops), strict=True))
        except Exception as exc:  # a bug below run_batch: fail the calls, keep serving
            ran = {id(op): True for op in ops}
            for op in ops:
                op.error, op.result = exc, None
        except BaseException:  # an interrupt: the callers stop waiting (what committed stays)
            for _, future in live:
                future.cancel()
            raise
        took = time.monotonic() - began
        if took > GATHER_SLOW:
            self._gather_paused_until = stalled(
                self.store.url,
                "a group commit",
                "the commits of a busy loop go through the store thread",
                began,
                took,
                pause_after(took),
            )
        refused = [(op, future) for op, future in live if not ran[id(op)]]
        if refused:
            with self._lock:
                queued = bool(self._threads)
                if queued:  # the store thread owns them now, and answers them
                    self._enqueue(refused)
            if not queued:
                closed = errors.DatabaseUnavailable(f"{self.store.url} is closed")
                for _, future in refused:
                    if not future.cancelled():
                        future.set_exception(closed)
        for op, future in live:
            if not ran[id(op)] or future.cancelled():
                continue
            if op.error is not None:
                future.set_exception(op.error)
            else:
                future.set_result(op.result)

    def _run_inline_batch(self, ops: list[base.Op]) -> list[bool]:
        """``_run_inline`` for a gathered batch: for each op, whether it ran here. With no
        call pending, a store thread that holds its turn is only delivering its last
        batch's answers (which may have woken this turn): it is waited for, briefly."""
        if not self._take_turn(HOLD_LOOP):
            return [False] * len(ops)
        try:
            return self.store.run_inline_batch(ops)
        finally:
            self._end_turn()

    def _enqueue(self, items: list[tuple[base.Op, asyncio.Future[Any]]]) -> None:
        """Queue gathered calls to the threads, in order (under ``_lock``)."""
        for op, future in items:
            self._pending += 1
            self._queue.put((op, (future.get_loop(), future), False))

    def _run_inline(self, op: base.Op) -> bool:
        """Run ``op`` on this thread if the store can (``Store.run_inline``); False, having
        changed nothing, if not. With one store thread this thread takes that thread's
        turn (``_exec``), so nothing else runs meanwhile; with several it counts as one
        more batch in flight (PostgreSQL runs it on a connection of its own), which a
        verb running alone (``marks.alone``) keeps out as it keeps out other batches."""
        if not self._take_turn(0):
            return False
        try:
            return self.store.run_inline(op)
        finally:
            self._end_turn()

    def _take_turn(self, wait: float) -> bool:
        """Take a turn to run calls on this thread (``_run_inline``): the one store thread's,
        waiting up to ``wait`` seconds for it, or a place among the batches in flight."""
        return self._exec.acquire(timeout=wait) if self._alone else self._gate.try_shared()

    def _end_turn(self) -> None:
        if self._alone:
            self._exec.release()
        else:
            self._gate.release_shared()

    async def _breathe(self, then: Callable[[T], None] | None, result: T) -> None:
        """After a call answered without the loop: yield to it once a millisecond, so a long
        run of such calls does not starve everything else on it; then ``then``, however
        the yield ended."""
        try:
            now = time.monotonic()
            if now - self._breathed >= _BREATHE_EVERY:
                self._breathed = now
                await asyncio.sleep(0)
        finally:
            if then is not None:
                then(result)

    def call_sync(
        self, fn: Callable[..., T], *args: Any, write: bool = True, _raw: bool = False
    ) -> T:
        """Run a verb on the store thread and wait for it (for code without a loop)."""
        return self.submit(fn, *args, write=write, _raw=_raw).result()

    def _put(self, op: base.Op, waiter: Any, raw: bool) -> None:
        with self._lock:
            if not self._threads:
                raise errors.DatabaseUnavailable(f"{self.store.url} is closed")
            if self._gathered:  # made before this call: they commit before it
                self._enqueue(self._gathered)
                self._gathered = []
            self._pending += 1
            self._queue.put((op, waiter, raw))

    def _answered(self, calls: int) -> None:
        with self._lock:
            self._pending -= calls

    def _serve(self, own_connection: bool = False) -> None:
        if own_connection:  # the first thread uses the store's connection, opened by start()
            self.store.use_own_connection()
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            batch = [item]
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._run(batch)
                    self._queue.put(_STOP)  # for the other threads
                    return
                batch.append(nxt)
            self._run(batch)
        self._queue.put(_STOP)  # for the other threads

    def _close(self) -> None:
        with self._exec:  # an inline call may still be running on the loop's thread
            self.store.close()

    def _run(self, batch: list[Any]) -> None:
        if self._alone:
            with self._exec:
                self._run_locked(batch)
            return
        # A connection per thread (an inline call has one of its own and counts as a batch
        # in flight). A verb marked marks.alone runs in a transaction of its own while no
        # other batch is in flight (see _Gate).
        shared = [item for item in batch if not marks.runs_alone(item[0].fn)]
        if shared:
            with self._gate.shared():
                self._run_locked(shared)
        for item in batch:
            if marks.runs_alone(item[0].fn):
                with self._gate.alone():
                    self._run_locked([item])

    def _run_locked(self, batch: list[Any]) -> None:
        # A caller cancelled while queued (Engine.close cancelling a recovery pass) gets
        # nothing run, and a result is never set on a cancelled future.
        calls = len(batch)
        batch = [item for item in batch if _wanted(item[1])]
        raw = [(op, waiter) for op, waiter, is_raw in batch if is_raw]
        txn = [(op, waiter) for op, waiter, is_raw in batch if not is_raw]
        for op, _ in raw:  # open/migrate manage their own transactions
            try:
                op.result = op.fn(*op.args)
            except Exception as exc:
                op.error = exc
        if txn:
            try:
                self.store.run_batch(base.lock_order([op for op, _ in txn]))
            except Exception as exc:  # a bug below run_batch: fail the calls, keep serving
                for op, _ in txn:
                    op.error = exc
        again = [pair for pair in txn if isinstance(pair[0].error, errors.TransactionConflict)]
        later = {id(op) for op, _ in again}
        self._answered(calls - len(again))  # before the callers hear: their next call may
        _deliver([pair for pair in raw + txn if id(pair[0]) not in later])  # run inline
        if again:
            self._run_again(again)
            self._answered(len(again))
            _deliver(again)

    def _run_again(self, pairs: list[tuple[base.Op, Any]]) -> None:
        """Run again, each alone, in the order made, the ops whose transaction the
        database undid to end a deadlock with another (``TransactionConflict``; with
        them the batch's later ops of the same workflow, left unrun): nothing of them was
        written, the rest of their batch is committed and answered. Two batches that
        lock the same rows in other orders meet so (``base.lock_order`` makes it rare);
        the one undone goes on once the other has moved on. An op is raised to its caller
        after ``CONFLICT_TRIES`` such ends in a row, and not run again once its caller
        has gone."""
        for op, waiter in pairs:
            tries = 1
            while (
                isinstance(op.error, errors.TransactionConflict)
                and tries < CONFLICT_TRIES
                and _still_wanted(waiter)
            ):
                time.sleep(CONFLICT_PAUSE * tries)
                if not _still_wanted(waiter):  # its caller went during the pause
                    break
                tries += 1
                log.debug("%s: run again after a conflict: %s", self.store.url, op.error)
                op.error = op.result = None
                try:
                    self.store.run_batch([op])
                except Exception as exc:  # a bug below run_batch: fail this call alone
                    op.error = exc


def _deliver(pairs: list[tuple[base.Op, Any]]) -> None:
    """Each op's result or error to its caller: a thread's future at once, a loop's
    through one ``call_soon_threadsafe`` per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], base.Op]]] = {}
    for op, waiter in pairs:
        if isinstance(waiter, concurrent.futures.Future):
            if op.error is not None:
                waiter.set_exception(op.error)
            else:
                waiter.set_result(op.result)
        else:
            loop, future = waiter
            by_loop.setdefault(loop, []).append((future, op))
    for loop, answers in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            loop.call_soon_threadsafe(_resolve, answers)


class _Gate:
    """Batches run side by side (``shared``); a verb marked ``marks.alone`` waits for the
    batches in flight to end, and holds new ones back until it is done (``alone``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0  # shared batches in flight
        self._alone = False  # a lone verb in flight
        self._waiting = 0  # lone verbs waiting: new batches wait behind them

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._alone or self._waiting:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            self.release_shared()

    def try_shared(self) -> bool:
        """Enter as ``shared`` does if that needs no wait (an inline call); else False."""
        with self._cond:
            if self._alone or self._waiting:
                return False
            self._running += 1
            return True

    def release_shared(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._alone or self._running:
                self._cond.wait()
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


def _wanted(waiter: Any) -> bool:
    if isinstance(waiter, concurrent.futures.Future):
        return waiter.set_running_or_notify_cancel()
    return not waiter[1].cancelled()


def _still_wanted(waiter: Any) -> bool:
    """Whether the caller of a call already running still waits for it (a thread's
    future, running, cannot be cancelled; a loop's can)."""
    return isinstance(waiter, concurrent.futures.Future) or not waiter[1].cancelled()


async def _answer(future: asyncio.Future[T], then: Callable[[T], None] | None) -> T:
    """Await ``future``; with ``then``, shielded, and ``then`` called with its result."""
    if then is None:
        return await future
    # The shield's callback is added first, so the caller's wake-up is scheduled before
    # anything ``then`` schedules: a start returns before the run it launched begins.
    shielded = asyncio.shield(future)
    future.add_done_callback(functools.partial(_then, then))
    return await shielded


def _then(then: Callable[[T], None], future: asyncio.Future[T]) -> None:
    if not future.cancelled() and future.exception() is None:
        then(future.result())


def _resolve(pairs: list[tuple[asyncio.Future[Any], base.Op]]) -> None:
    for future, op in pairs:
        if future.done():
            continue
        if op.error is not None:
            future.set_exception(op.error)
        else:
            future.set_result(op.result)
