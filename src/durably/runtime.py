"""One run of one workflow: the commit protocol of its durable calls.

A :class:`Run` is created by the engine each time it (re)starts a workflow from
its first line. Workflow-side calls reach it through ``context.current_run``.
For a step it follows DESIGN.md's protocol: look the call up in the journal;
if it is new, run the function and commit the receipt, fenced by the lease
epoch, in one transaction, and only then return to the workflow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from durably import codec, context, errors, faults, journal, replay
from durably.storage import dispatch

if TYPE_CHECKING:
    from durably.step import StepDefinition

T = TypeVar("T")

#: Transient store errors a commit waits out before giving the run up.
_TRANSIENT = (errors.DatabaseLocked, errors.DatabaseUnavailable)


class Suspended(BaseException):
    """Unwinds a workflow that must stop here and be resumed later (engine draining).

    A BaseException so that a workflow's own ``except Exception`` cannot swallow it.
    """


@dataclasses.dataclass(slots=True)
class Services:
    """What a run needs from its engine."""

    store: dispatch.StoreThread
    clock: Callable[[], float]
    step_threads: concurrent.futures.ThreadPoolExecutor
    stopping: asyncio.Event
    commit_patience: float = 30.0  # seconds to wait out a locked or unreachable database


class Run:
    """The state of one workflow run: its journal, its lease epoch, unflushed values."""

    def __init__(
        self, services: Services, info: journal.WorkflowInfo, history: list[journal.Entry]
    ) -> None:
        self.services = services
        self.workflow_id = info.workflow_id
        self.epoch = info.epoch
        self.replayer = replay.Replayer(info.workflow_id, history)
        self.pending: list[journal.Entry] = []  # journaled values not yet committed
        self.lost: errors.FencedError | None = None

    # --- commits --------------------------------------------------------------

    async def commit(self, *entries: journal.Entry) -> None:
        """Commit entries (and any pending journaled values) fenced by this run's epoch."""
        batch = [*self.pending, *entries]
        store, wid, epoch = self.services.store.store, self.workflow_id, self.epoch
        await self._fenced(lambda now: store.append_entries(wid, epoch, batch, now))
        self.pending.clear()
        for entry in batch:
            self.replayer.record(entry)

    async def finish(self, status: str, output: str | None, error: str | None) -> None:
        """Commit the final status with any pending journaled values."""
        batch = list(self.pending)
        store, wid, epoch = self.services.store.store, self.workflow_id, self.epoch
        await self._fenced(
            lambda now: store.finish_workflow(wid, epoch, status, output, error, batch, now)
        )
        self.pending.clear()

    async def _fenced(self, write: Callable[[float], None]) -> None:
        """Run a fenced write on the store thread, waiting out a locked database a while."""
        if self.lost is not None:
            raise self.lost
        delay, waited = 0.05, 0.0
        while True:
            try:
                await self.services.store.call(write, self.services.clock())
                return
            except errors.FencedError as exc:
                self.lost = exc
                raise
            except _TRANSIENT:
                if waited >= self.services.commit_patience:
                    raise
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 2.0)

    async def flush(self) -> None:
        """Commit pending journaled values now (before a step may observe them)."""
        if self.pending:
            await self.commit()

    # --- journaled values -------------------------------------------------------

    def journal_value(self, kind: journal.Kind, make: Callable[[], T]) -> T:
        """Return the recorded value at the next seq, or make, record and return a new one."""
        self._check_usable()
        seq = self.replayer.next_seq()
        entry = self.replayer.lookup(seq, kind, "")
        if entry is not None:
            return codec.decode(entry.payload or "null", where=f"{kind} at seq {seq}")  # type: ignore[return-value]
        value = make()
        now = self.services.clock()
        payload = codec.encode(value, where=f"durably.{kind}() at seq {seq}")
        new = journal.Entry(seq, kind, "", journal.EntryStatus.COMPLETED, 1, payload, now, now)
        self.pending.append(new)
        self.replayer.record(new)
        return value

    # --- steps --------------------------------------------------------------------

    def call_step(
        self, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Coroutine[Any, Any, Any]:
        """Take the step's seq now, in program order, and return the awaitable that runs it."""
        self._check_usable()
        return self._step(self.replayer.next_seq(), step, args, kwargs)

    async def _step(
        self, seq: int, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        entry = self.replayer.lookup(seq, journal.Kind.STEP, step.name)
        where = f"step {step.name!r} (workflow {self.workflow_id!r}, seq {seq})"
        attempt = 1
        if entry is not None:
            if entry.status == journal.EntryStatus.COMPLETED:
                return codec.decode(entry.payload or "null", where=f"{where} result")
            if entry.status == journal.EntryStatus.FAILED:
                raise _recorded_error(entry, where)
            if entry.status == journal.EntryStatus.RETRYING:
                attempt = entry.attempt + 1
                if entry.wake_at is not None:
                    await self._backoff(entry.wake_at - self.services.clock(), step.name)
        key = f"{self.workflow_id}:{seq}"
        await self.flush()
        while True:
            self._check_stopping()
            faults.reached("before_call", step.name)
            started = self.services.clock()
            ctx = context.StepContext(self.workflow_id, seq, step.name, attempt, key)
            try:
                result = await self._invoke(step, args, kwargs, ctx)
            except Exception as exc:
                finished = self.services.clock()
                delay = step.retry.delay_after(attempt, exc) if step.retry else None
                if delay is None:
                    failed = journal.Entry(
                        seq,
                        journal.Kind.STEP,
                        step.name,
                        journal.EntryStatus.FAILED,
                        attempt,
                        _encode_error(exc),
                        started,
                        finished,
                    )
                    await self.commit(failed)
                    raise
                wake = finished + delay
                retrying = journal.Entry(
                    seq,
                    journal.Kind.STEP,
                    step.name,
                    journal.EntryStatus.RETRYING,
                    attempt,
                    _encode_error(exc),
                    started,
                    finished,
                    wake,
                )
                await self.commit(retrying)
                faults.reached("in_backoff", step.name)
                await self._backoff(delay, step.name)
                attempt += 1
                continue
            finished = self.services.clock()
            faults.reached("after_call", step.name)
            try:
                payload = codec.encode(result, where=f"{where} result")
            except errors.EncodeError as exc:
                failed = journal.Entry(
                    seq,
                    journal.Kind.STEP,
                    step.name,
                    journal.EntryStatus.FAILED,
                    attempt,
                    _encode_error(exc),
                    started,
                    finished,
                )
                await self.commit(failed)
                raise
            done = journal.Entry(
                seq,
                journal.Kind.STEP,
                step.name,
                journal.EntryStatus.COMPLETED,
                attempt,
                payload,
                started,
                finished,
            )
            await self.commit(done)
            faults.reached("after_receipt", step.name)
            return codec.decode(payload, where=f"{where} result")

    async def _invoke(
        self,
        step: StepDefinition,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ctx: context.StepContext,
    ) -> Any:
        token = context.current_step.set(ctx)
        try:
            if step.is_async:
                awaitable: Awaitable[Any] = step.fn(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                call = functools.partial(step.fn, *args, **kwargs)
                awaitable = loop.run_in_executor(
                    self.services.step_threads, contextvars.copy_context().run, call
                )
            if step.timeout is None:
                return await awaitable
            try:
                async with asyncio.timeout(step.timeout) as scope:
                    return await awaitable
            except TimeoutError:
                if scope.expired():
                    raise errors.StepTimeout(
                        f"step {step.name!r} attempt {ctx.attempt} ran longer than its "
                        f"timeout of {step.timeout}s"
                    ) from None
                raise
        finally:
            context.current_step.reset(token)

    async def _backoff(self, seconds: float, name: str) -> None:
        """Wait out a retry delay; the wake-up time is already in the journal."""
        if seconds <= 0:
            return
        stopping = self.services.stopping
        try:
            await asyncio.wait_for(stopping.wait(), timeout=seconds)
        except TimeoutError:
            return
        raise Suspended(f"engine stopping during the back-off of step {name!r}")

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self.replayer.diverged is not None:
            raise self.replayer.diverged

    def _check_stopping(self) -> None:
        if self.services.stopping.is_set():
            raise Suspended("engine stopping")


def _encode_error(exc: BaseException) -> str:
    return codec.encode(codec.encode_error(exc), where="step error")


def _recorded_error(entry: journal.Entry, where: str) -> BaseException:
    data = codec.decode(entry.payload or "{}", where=f"{where} recorded error")
    if not isinstance(data, dict):
        return errors.DecodeError(f"{where}: recorded error is not an object")
    return codec.decode_error(data)
