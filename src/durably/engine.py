"""The Engine: starts workflows, runs them, and recovers the ones whose owner died.

An engine is one executor. On entry it opens the store, registers itself, and
claims every unfinished workflow whose owner is gone (at once for a dead
process on this host, after the lease for others). Each claimed or started
workflow runs as an asyncio task that replays its journal from the first line.
Leases are renewed by one heartbeat for the whole executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from durably import codec, context, errors, faults, journal, liveness, runtime, workflow
from durably.storage import base, create_store, dispatch, resolve_url

log = logging.getLogger("durably")

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
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.01
        while True:
            task = self.engine._tasks.get(self.workflow_id)
            if task is not None:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                await asyncio.wait({task}, timeout=left)
            info = await self.info()
            if info.finished:
                return outcome(info)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"workflow {self.workflow_id!r} is still {info.status}")
            wait = delay if deadline is None else min(delay, max(0.0, deadline - loop.time()))
            await asyncio.sleep(wait)
            delay = min(delay * 1.5, 0.5)


def outcome(info: journal.WorkflowInfo) -> Any:
    """A finished workflow's result, or raise its recorded error."""
    where = f"workflow {info.workflow_id!r}"
    if info.status == journal.Status.COMPLETED:
        return codec.decode(info.output or "null", where=f"{where} output")
    if info.status == journal.Status.CANCELLED:
        raise errors.Cancelled(f"{where} was cancelled")
    data = codec.decode(info.error or "{}", where=f"{where} error")
    if isinstance(data, dict):
        raise codec.decode_error(data)
    raise errors.WorkflowFailed(f"{where} ended {info.status}")


class Engine:
    """Runs durable workflows against one database (an async context manager).

    ``url`` is ``sqlite:///path`` (default: ``DURABLY_DATABASE_URL``, else
    ``sqlite:///durably.db``). ``lease_seconds`` bounds how long another host
    waits before taking over the work of an executor that vanished;
    ``max_recoveries`` is how many crashes in a row, without any progress in
    its journal, a workflow may cause before it is marked failed.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        lease_seconds: float = 30.0,
        max_recoveries: int = 5,
        poll_interval: float = 1.0,
        step_threads: int = 32,
        executor_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease_seconds <= 0 or poll_interval <= 0:
            raise ValueError("lease_seconds and poll_interval must be > 0")
        self.url = resolve_url(url)
        self.lease_seconds = lease_seconds
        self.max_recoveries = max_recoveries
        self.poll_interval = poll_interval
        self.clock = clock
        self._store = dispatch.StoreThread(create_store(self.url))
        self._step_threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=step_threads, thread_name_prefix="durably-step"
        )
        self._executor_id = executor_id
        self._me: journal.ExecutorInfo | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: list[asyncio.Task[None]] = []
        self._services: runtime.Services | None = None
        self._kick: asyncio.Event | None = None

    # --- lifecycle -------------------------------------------------------------

    @property
    def executor_id(self) -> str:
        """This executor's id, as recorded in leases and claims."""
        if self._me is None:
            raise errors.DurablyError("the engine is not open; use `async with Engine(...)`")
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
        self._me = liveness.this_executor(self.clock(), self._executor_id)
        self._services = runtime.Services(
            store=self._store,
            clock=self.clock,
            step_threads=self._step_threads,
            stopping=asyncio.Event(),
        )
        self._kick = asyncio.Event()
        await self._call(self._store.store.register_executor, self._me)
        await self.recover()
        self._background = [
            asyncio.create_task(self._heartbeat_loop(), name="durably-heartbeat"),
            asyncio.create_task(self._recovery_loop(), name="durably-recovery"),
        ]

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop: running steps finish and commit, workflows suspend, leases are released."""
        if self._services is None:
            self._store.stop()
            self._step_threads.shutdown(wait=False)
            return
        self._services.stopping.set()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        running = list(self._tasks.values())
        if running:
            _, late = await asyncio.wait(running, timeout=drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            await self._call(self._store.store.release_owned, self.executor_id, self.clock())
            await self._call(self._store.store.remove_executor, self.executor_id, False)
        except errors.StoreError as exc:
            log.warning("could not release leases on close: %s", exc)
        self._services = None
        await asyncio.get_running_loop().run_in_executor(None, self._store.stop)
        self._step_threads.shutdown(wait=False)

    def _require_open(self) -> runtime.Services:
        if self._services is None:
            raise errors.DurablyError("the engine is not open; use `async with Engine(...)`")
        return self._services

    async def _call(self, fn: Callable[..., R], *args: Any, write: bool = True) -> R:
        return await self._store.call(fn, *args, write=write)

    # --- starting and reading workflows -------------------------------------------

    async def start(
        self, wf: Any, *args: Any, workflow_id: str | None = None, **kwargs: Any
    ) -> WorkflowHandle:
        """Start a workflow; return once its id and input are committed.

        Starting an id that exists returns the existing workflow and runs
        nothing; a different workflow under that id raises WorkflowIdConflict.
        """
        services = self._require_open()
        definition = workflow.definition_of(wf)
        wid = workflow_id or uuid.uuid4().hex
        payload = codec.encode(
            {"args": list(args), "kwargs": kwargs}, where=f"workflow {definition.name!r} input"
        )
        new = base.NewWorkflow(
            wid, definition.name, payload, definition.version, definition.source_hash
        )
        now = self.clock()
        info, created = await self._call(
            self._store.store.create_workflow, new, self.executor_id, now + self.lease_seconds, now
        )
        if info.name != definition.name:
            raise errors.WorkflowIdConflict(
                f"workflow id {wid!r} already names a {info.name!r} workflow, "
                f"not {definition.name!r}"
            )
        if created:
            self._launch(services, info, definition)
        elif not info.finished:
            self._kick_recovery()
        return WorkflowHandle(self, wid)

    def handle(self, workflow_id: str) -> WorkflowHandle:
        """A handle to an existing workflow (checked when used)."""
        return WorkflowHandle(self, workflow_id)

    async def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo:
        """The workflow's row; WorkflowNotFound if there is none."""
        info = await self._call(self._store.store.get_workflow, workflow_id, write=False)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        return info

    async def list_workflows(
        self, status: str | None = None, name: str | None = None, limit: int = 100
    ) -> list[journal.WorkflowInfo]:
        """Workflows, newest first, optionally filtered by status and workflow name."""
        if status is not None:
            status = journal.Status(status).value
        return await self._call(self._store.store.list_workflows, status, name, limit, write=False)

    async def history(self, workflow_id: str) -> list[journal.Entry]:
        """The workflow's journal, in seq order."""
        await self.get_workflow(workflow_id)
        return await self._call(self._store.store.load_history, workflow_id, write=False)

    async def claims(self, workflow_id: str) -> list[journal.Claim]:
        """Every change of owner of the workflow: starts, recoveries, resumes."""
        return await self._call(self._store.store.load_claims, workflow_id, write=False)

    async def executors(self) -> list[journal.ExecutorInfo]:
        """The executors registered in the database."""
        return await self._call(self._store.store.list_executors, write=False)

    # --- recovery ----------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """Claim and run every unfinished workflow whose owner is gone; return their ids."""
        services = self._require_open()
        store = self._store.store
        for other in await self._call(store.list_executors, write=False):
            if other.executor_id != self.executor_id and liveness.is_dead_here(other):
                log.info("executor %s is dead; its workflows are free", other.executor_id)
                await self._call(store.remove_executor, other.executor_id, True)
        claimed: list[str] = []
        now = self.clock()
        for candidate in await self._call(store.claimable, now, 500, write=False):
            if candidate.workflow_id in self._tasks:
                continue
            definition = workflow.registered(candidate.name)
            if definition is None or definition.version != candidate.version:
                continue
            info = await self._call(
                store.claim, candidate, self.executor_id, now + self.lease_seconds, now
            )
            if info is None:
                continue
            claimed.append(info.workflow_id)
            self._launch(services, info, definition)
        return claimed

    def _kick_recovery(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _recovery_loop(self) -> None:
        assert self._kick is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.poll_interval)
            self._kick.clear()
            try:
                await self.recover()
            except errors.StoreError as exc:
                log.warning("recovery pass failed: %s", exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            now = self.clock()
            try:
                await self._call(
                    self._store.store.heartbeat, self.executor_id, now, now + self.lease_seconds
                )
            except errors.StoreError as exc:
                log.warning("heartbeat failed: %s", exc)

    # --- running one workflow ---------------------------------------------------------

    def _launch(
        self,
        services: runtime.Services,
        info: journal.WorkflowInfo,
        definition: workflow.WorkflowDefinition,
    ) -> None:
        task = asyncio.create_task(
            self._drive(services, info, definition), name=f"durably:{info.workflow_id}"
        )
        self._tasks[info.workflow_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(info.workflow_id, None))

    async def _drive(
        self,
        services: runtime.Services,
        info: journal.WorkflowInfo,
        definition: workflow.WorkflowDefinition,
    ) -> None:
        wid = info.workflow_id
        history = await self._call(self._store.store.load_history, wid, write=False)
        run = runtime.Run(services, info, history)
        try:
            if info.crash_count > self.max_recoveries:
                await run.finish(journal.Status.FAILED, None, self._poison(info, history))
                return
            try:
                call = codec.decode(info.input, where=f"workflow {wid!r} input")
                assert isinstance(call, dict)
            except errors.DecodeError as exc:
                log.error("cannot resume %s: %s", wid, exc)
                await self._call(self._store.store.release, wid, run.epoch, self.clock())
                return
            context.current_run.set(run)
            result = await definition.fn(*call["args"], **call["kwargs"])
            run.replayer.check_finished()
            output = codec.encode(result, where=f"workflow {definition.name!r} ({wid!r}) result")
            faults.reached("before_finish", definition.name)
            await run.finish(journal.Status.COMPLETED, output, None)
        except runtime.Suspended:
            log.info("workflow %s suspended", wid)
        except errors.FencedError as exc:
            log.warning("workflow %s: %s", wid, exc)
        except Exception as exc:
            await self._fail(run, exc)

    def _poison(self, info: journal.WorkflowInfo, history: list[journal.Entry]) -> str:
        last = history[-1].describe() + f" at seq {history[-1].seq}" if history else "its start"
        return _error_payload(
            errors.WorkflowFailed(
                f"workflow {info.workflow_id!r} crashed its executor {info.crash_count} times "
                f"in a row without progress (limit {self.max_recoveries}); the last journal "
                f"entry is {last}"
            )
        )

    async def _fail(self, run: runtime.Run, exc: Exception) -> None:
        diverged = run.replayer.diverged
        if diverged is not None or isinstance(exc, errors.NonDeterminismError):
            status, err = journal.Status.DIVERGED, diverged or exc
            log.error("workflow %s diverged: %s", run.workflow_id, err)
        elif isinstance(exc, errors.StoreError):
            log.error("workflow %s stopped, the database failed: %s", run.workflow_id, exc)
            return  # nothing can be written; recovery will resume it from its journal
        else:
            status, err = journal.Status.FAILED, exc
        try:
            await run.finish(status, None, _error_payload(err))
        except errors.StoreError as store_exc:
            log.error("could not record the end of workflow %s: %s", run.workflow_id, store_exc)


def _error_payload(exc: BaseException) -> str:
    return codec.encode(codec.encode_error(exc), where="workflow error")


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
