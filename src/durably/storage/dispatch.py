"""One thread per store that runs every storage call, committing in groups.

The engine is asyncio; the stores are synchronous. Every call is queued to this
thread, which drains whatever is waiting and runs it in one transaction, so
concurrent workflows share one commit (group commit) and the event loop never
blocks on a disk flush. See docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from durably import errors
from durably.storage import base

T = TypeVar("T")

_STOP = object()

#: The longest a run of inline commits keeps the event loop to itself (seconds): then it
#: yields once, so timers and I/O of everything else on the loop are served.
_BREATHE_EVERY = 0.001


class StoreThread:
    """Runs a Store's verbs on a dedicated thread, batching concurrent calls."""

    def __init__(self, store: base.Store, *, max_batch: int = 128) -> None:
        self.store = store
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._exec = threading.Lock()  # whoever runs store verbs holds it: thread or inline
        self._breathed = 0.0  # time.monotonic() when an inline commit last yielded the loop

    def start(self) -> None:
        """Open the store on the thread and begin serving. Raises what open raised."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._serve, name="durably-store", daemon=True)
            self._thread.start()
        try:
            self.call_sync(self.store.open, write=True, _raw=True)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Finish queued calls, close the store and end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(_STOP)  # under the lock: nothing can be queued behind it
        thread.join()

    def submit(
        self, fn: Callable[..., T], *args: Any, write: bool = True, _raw: bool = False
    ) -> concurrent.futures.Future[T]:
        """Queue a verb; the future holds its result or its error."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(base.Op(fn, args, write), future, _raw)
        return future

    async def call(
        self, fn: Callable[..., T], *args: Any, write: bool = True, inline: bool = False
    ) -> T:
        """Await a verb run on the store thread.

        The result comes back through one ``call_soon_threadsafe`` per batch and
        loop, the cheapest hand-off asyncio offers (see benchmarks/). With
        ``inline``, when the thread is idle and the store can commit without
        waiting for a lock, the verb runs here instead: on a small machine the
        two thread wake-ups cost more than the commit (docs/decisions.md). A run
        of inline commits yields to the loop once a millisecond (``_BREATHE_EVERY``),
        not after each: a loop iteration costs as much as the rest of a step's
        Python on SQLite NORMAL, and the loop was quiet when each commit began.
        """
        if inline and self._queue.empty() and self._exec.acquire(blocking=False):
            try:
                op = base.Op(fn, args, write)
                done = self.store.run_inline(op)
            finally:
                self._exec.release()
            if done:
                now = time.monotonic()
                if now - self._breathed >= _BREATHE_EVERY:  # a long run must not starve it
                    self._breathed = now
                    await asyncio.sleep(0)
                if op.error is not None:
                    raise op.error
                return op.result  # type: ignore[no-any-return]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put(base.Op(fn, args, write), (loop, future), False)
        return await future

    def call_sync(
        self, fn: Callable[..., T], *args: Any, write: bool = True, _raw: bool = False
    ) -> T:
        """Run a verb on the store thread and wait for it (for code without a loop)."""
        return self.submit(fn, *args, write=write, _raw=_raw).result()

    def _put(self, op: base.Op, waiter: Any, raw: bool) -> None:
        with self._lock:
            if self._thread is None:
                raise errors.DatabaseUnavailable(f"{self.store.url} is closed")
            self._queue.put((op, waiter, raw))

    def _serve(self) -> None:
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
                    self._close()
                    return
                batch.append(nxt)
            self._run(batch)
        self._close()

    def _close(self) -> None:
        with self._exec:  # an inline call may still be running on the loop's thread
            self.store.close()

    def _run(self, batch: list[Any]) -> None:
        with self._exec:
            self._run_locked(batch)

    def _run_locked(self, batch: list[Any]) -> None:
        # A caller cancelled while queued (Engine.close cancelling a recovery pass) gets
        # nothing run, and a result is never set on a cancelled future.
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
                self.store.run_batch([op for op, _ in txn])
            except Exception as exc:  # a bug below run_batch: fail the calls, keep serving
                for op, _ in txn:
                    op.error = exc
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], base.Op]]] = {}
        for op, waiter in raw + txn:
            if isinstance(waiter, concurrent.futures.Future):
                if op.error is not None:
                    waiter.set_exception(op.error)
                else:
                    waiter.set_result(op.result)
            else:
                loop, future = waiter
                by_loop.setdefault(loop, []).append((future, op))
        for loop, pairs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, pairs)


def _wanted(waiter: Any) -> bool:
    if isinstance(waiter, concurrent.futures.Future):
        return waiter.set_running_or_notify_cancel()
    return not waiter[1].cancelled()


def _resolve(pairs: list[tuple[asyncio.Future[Any], base.Op]]) -> None:
    for future, op in pairs:
        if future.done():
            continue
        if op.error is not None:
            future.set_exception(op.error)
        else:
            future.set_result(op.result)
