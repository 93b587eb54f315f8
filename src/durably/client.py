"""Client: start and read workflows without ever executing one.

For command lines, web handlers and other services. A client never claims a
workflow: ``start`` commits a ``pending`` workflow that any engine (worker)
picks up. Its methods are synchronous; from async code, call them through
``asyncio.to_thread`` or use the Engine's async methods. The logic of each
call is the Engine's too, written once in :mod:`durably.operations`.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from durably import journal, operations, step_call, validate
from durably.storage import base, create_store, resolve_url, thread
from durably.storage.base import WorkflowQuery

R = TypeVar("R")


class Client:
    """A connection to a durably database that reads and starts, but runs nothing."""

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        """``create=False`` for a reader: a database that does not exist (a mistyped
        path) raises DatabaseNotFound on open instead of being created empty."""
        self._store = thread.StoreThread(create_store(resolve_url(url), create=create))
        self.url = self._store.store.url  # as shown in messages: without a password
        self._ops = operations.Operations(self._store.store, time.time)
        self._open = False

    def __enter__(self) -> Client:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect, migrating the schema if it is behind."""
        if not self._open:
            self._store.start()
            self._open = True

    def close(self) -> None:
        """Disconnect. Idempotent."""
        if self._open:
            self._store.stop()
            self._open = False

    def _call(self, fn: Callable[..., R], *args: Any, write: bool = False) -> R:
        self.open()
        return self._store.call_sync(fn, *args, write=write)

    def _run(self, plan: operations.Plan[R]) -> R:
        self.open()
        return operations.run_sync(plan, self._store)

    # --- reading ------------------------------------------------------------------

    def schema_version(self) -> int:
        """The schema version of the database (migrating it first if behind)."""
        return self._call(self._store.store.schema_version)

    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo:
        """The workflow's row; WorkflowNotFound if there is none."""
        return self._run(self._ops.get_workflow(workflow_id))

    def list_workflows(
        self,
        status: str | None = None,
        name: str | None = None,
        limit: int = 100,
        *,
        ids: Iterable[str] | None = None,
        id_prefix: str | None = None,
        parent_id: str | None = None,
        queue: str | None = None,
        created_after: float | datetime.datetime | None = None,
        created_before: float | datetime.datetime | None = None,
        offset: int = 0,
        order: str = "desc",
        after: str | tuple[float, str] | None = None,
    ) -> list[journal.WorkflowInfo]:
        """Workflows, newest first (``order="asc"``: oldest first), filtered.

        Every filter given must hold: ``status``, workflow ``name``, ``ids`` (a
        list), ``id_prefix`` (a plain prefix), ``parent_id`` (its children),
        ``queue``, ``created_after`` (inclusive) and ``created_before``
        (exclusive), as datetimes or epoch seconds. Page with ``limit`` and
        ``offset``, or with ``after``: the id of the last row of the previous
        page (a cursor that never repeats or skips a row).
        """
        filters = dict(
            ids=ids,
            id_prefix=id_prefix,
            parent_id=parent_id,
            queue=queue,
            created_after=created_after,
            created_before=created_before,
            offset=offset,
            order=order,
            after=after,
        )
        return self._run(self._ops.list_workflows(status, name, limit, **filters))

    def search_workflows(self, query: WorkflowQuery) -> list[journal.WorkflowInfo]:
        """One page of workflows, newest first, matching ``query`` (for paging dashboards)."""
        return self._run(self._ops.search_workflows(query))

    def count_by_status(self, cap: int | None = None) -> dict[str, int]:
        """How many workflows each status has (a status with none is absent).

        Exact, it reads an index entry per workflow, which grows with history.
        With ``cap`` (at least 1) no count goes past it, and a count of ``cap``
        means at least that many: a read that stays as cheap however many have
        finished (the dashboard's counts).
        """
        return self._run(self._ops.count_by_status(cap))

    def count_unfinished(self) -> dict[str, int]:
        """How many workflows each unfinished status has (a read of those workflows only,
        however many have finished)."""
        return self._run(self._ops.count_unfinished())

    def history(self, workflow_id: str) -> list[journal.Entry]:
        """The workflow's journal in seq order."""
        return self._run(self._ops.history(workflow_id))

    def history_page(
        self,
        workflow_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int,
    ) -> list[journal.Entry]:
        """One page of the workflow's journal, in seq order: the first ``limit`` entries
        after ``after_seq``, else the last ``limit`` before ``before_seq``, or the newest
        ``limit`` without either (seqs start at 1: ``after_seq=0`` is the first page).

        Read through the journal's primary key, so a page costs its own rows however
        long the journal (``history`` reads every entry). Paging on from a page's last
        seq (``after_seq``) or its first (``before_seq``) reads every entry exactly once.
        WorkflowNotFound for an unknown id; ValueError for a ``limit`` below 1, a seq
        that is not an int, or both seqs given.
        """
        return self._run(self._ops.history_page(workflow_id, after_seq, before_seq, limit))

    def history_steps(self, workflow_id: str, name_prefix: str = "") -> list[journal.Entry]:
        """The workflow's step entries whose name starts with ``name_prefix``, in seq order,
        chosen by the database: a journal's model calls
        (``durably.agents.usage.MODEL_STEP_PREFIX``) without reading its every payload.
        WorkflowNotFound for an unknown id, as ``history``."""
        return self._run(self._ops.history_steps(workflow_id, name_prefix))

    def history_mark(self, workflow_id: str) -> journal.HistoryMark:
        """What tells this state of the workflow's journal and signals from another, read
        through indexes: its cost does not grow with the journal's payloads, for a page
        that looks again and again. With the workflow's ``updated_at`` (which a resume
        that rewrites entries changes) it changes whenever ``history`` would read
        differently. Unlike ``history``, an unknown id is not an error."""
        return self._run(self._ops.history_mark(workflow_id))

    def claims(self, workflow_id: str) -> list[journal.Claim]:
        """Every change of owner of the workflow."""
        return self._run(self._ops.claims(workflow_id))

    def executors(self) -> list[journal.ExecutorInfo]:
        """The executors registered in the database."""
        return self._run(self._ops.executors())

    # --- starting -------------------------------------------------------------------

    def start(
        self,
        wf: Any,
        *args: Any,
        workflow_id: str | None = None,
        max_recoveries: int | None = None,
        delay: float = 0.0,
        timeout: float | datetime.timedelta | None = None,
        **kwargs: Any,
    ) -> str:
        """Commit a pending workflow for a worker to run; return its id.

        ``wf`` is a decorated workflow or a workflow name, which need not be
        registered in this process (a service that does not import the
        workflow code). Idempotent on ``workflow_id`` like ``Engine.start``.
        ``max_recoveries`` overrides the workflow's and the engine's limit.
        ``delay`` (seconds): no worker starts it before the delay has passed.
        ``timeout`` gives it a deadline, counted from now (see ``Engine.start``).
        """
        seconds = validate.number(delay, "delay")
        new, _ = operations.new_workflow(
            wf, args, kwargs, workflow_id, max_recoveries, timeout, seconds
        )
        self._run(self._ops.start(new))
        return new.workflow_id

    def submit(self, new: base.NewWorkflow) -> journal.WorkflowInfo:
        """Commit a prepared pending workflow (a queue's ``enqueue_sync``); return its row:
        the new one, or the one already holding its id or its queue's deduplication id."""
        store = self._store.store
        info, _ = self._call(store.create_workflow, new, None, None, time.time(), write=True)
        return info

    # --- signals, events, cancel, resume, fork ---------------------------------------

    def send_signal(
        self, workflow_id: str, name: str, payload: Any = None, idempotency_key: str | None = None
    ) -> bool:
        """Send a signal, committed before this returns; False if the key was used before.

        Raises WorkflowFinished if the workflow has ended (the signal is not kept),
        as ``Engine.send_signal`` does.
        """
        return self._run(self._ops.send_signal(workflow_id, name, payload, idempotency_key))

    def send_signals(self, signals: Sequence[tuple[Any, ...]]) -> list[bool]:
        """Send several signals in one transaction: all are kept, or none is.

        Each is ``(workflow_id, name)``, ``(workflow_id, name, payload)`` or
        ``(workflow_id, name, payload, idempotency_key)``; the answer says, for
        each, whether it was kept (False: its key was used before). An unknown
        or finished workflow refuses the whole batch.
        """
        return self._run(self._ops.send_signals(signals))

    def get_event(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        """The value the workflow published under ``key``, waiting up to ``timeout`` for it."""
        return self._run(self._ops.get_event(workflow_id, key, timeout))

    def cancel(self, workflow_id: str) -> list[str]:
        """Ask the workflow and its unfinished children to stop; the ids asked.

        Final once this returns, as ``Engine.cancel``: one not started yet is
        ``cancelled`` at once and never runs.
        """
        return self._run(self._ops.cancel(workflow_id))

    def resume(self, workflow_id: str) -> None:
        """Make a failed, cancelled or diverged workflow run again from where it stopped.

        A pending workflow waiting on its queue leaves the queue: any worker with
        its code starts it now, whatever the queue's limits.
        """
        self._run(self._ops.resume(workflow_id))

    def fork(self, workflow_id: str, from_seq: int, new_id: str | None = None) -> str:
        """A new workflow with the first ``from_seq`` journal entries of this one; its id.

        ``errors.NotForkable`` when they hold a step whose outcome is open; see
        :meth:`durably.Engine.fork`.
        """
        return self._run(self._ops.fork(workflow_id, from_seq, new_id))

    def cancel_workflows(self, **filters: Any) -> list[str]:
        """Cancel every workflow the filters select (those of ``list_workflows`` but the
        paging ones; at least one), in one transaction; the ids asked to stop."""
        return self._run(self._ops.cancel_many(filters))

    def resume_workflows(self, **filters: Any) -> list[str]:
        """Resume every workflow the filters select (at least one), all or none; the ids.

        Each must be resumable: filter by ``status`` (``failed``, ``cancelled``...).
        """
        return self._run(self._ops.resume_many(filters))

    def delete(self, *workflow_ids: str, force: bool = False) -> list[str]:
        """Remove workflows with their children, journals and every row naming them.

        All or none; the ids removed. An unfinished one raises WorkflowNotFinished
        (cancel it first) unless ``force``: its owner, if running, is fenced out.
        """
        return self._run(self._ops.delete(workflow_ids, force))

    def delete_workflows(self, *, force: bool = False, **filters: Any) -> list[str]:
        """``delete`` every workflow the filters select (at least one), all or none."""
        return self._run(self._ops.delete_many(filters, force))

    def signals(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every signal sent to the workflow, consumed or not."""
        return self._run(self._ops.signals(workflow_id))

    def signals_page(
        self, workflow_id: str, *, before_num: int | None = None, limit: int
    ) -> list[dict[str, Any]]:
        """One page of the signals sent to the workflow, consumed or not, in num order (the
        dicts of ``signals``): the last ``limit`` before ``before_num``, or the newest
        ``limit`` without it.

        Read through the signals' primary key, so a page costs its own rows however many
        were sent (``signals`` reads them all). Paging on from a page's first num
        (``before_num``) reads every signal exactly once; ``history_mark`` counts them.
        WorkflowNotFound for an unknown id; ValueError for a ``limit`` below 1 or a num
        that is not an int.
        """
        return self._run(self._ops.signals_page(workflow_id, before_num, limit))

    # --- the review queue -----------------------------------------------------------

    def reviews(self, workflow_id: str | None = None) -> list[journal.Review]:
        """Steps parked in ``needs_review``, oldest first."""
        return self._run(self._ops.reviews(workflow_id))

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        *,
        result: Any = step_call.NO_RESULT,
        retry: bool = False,
        fail: str | None = None,
        by: str = "unknown",
        attempt: int | None = None,
    ) -> journal.Review:
        """Decide a parked step once: its ``result``, ``retry=True`` or ``fail="reason"``.

        ``attempt``: the review decided, as listed; see :meth:`durably.Engine.resolve`.
        """
        return self._run(self._ops.resolve(workflow_id, seq, result, retry, fail, by, attempt))

    # --- approvals of agent tool calls --------------------------------------------------

    def approve(
        self,
        workflow_id: str,
        *,
        by: str,
        tool_call_id: str | None = None,
        expect: Any = None,
        override_args: Any = None,
        note: str = "",
    ) -> Any:
        """Approve the workflow's pending tool call (see :func:`durably.agents.approve`)."""
        from durably.agents import decisions

        fields = decisions.fields("approve", by, note, override_args)
        return self._run(
            decisions.decide_plan(self._ops, workflow_id, tool_call_id, expect, fields)
        )

    def reject(
        self,
        workflow_id: str,
        *,
        by: str,
        reason: str = "",
        tool_call_id: str | None = None,
        expect: Any = None,
    ) -> Any:
        """Reject the workflow's pending tool call; the model reads the reason."""
        from durably.agents import decisions

        fields = decisions.fields("reject", by, reason, None)
        return self._run(
            decisions.decide_plan(self._ops, workflow_id, tool_call_id, expect, fields)
        )

    def list_approvals(self, workflow_id: str | None = None, *, limit: int = 1000) -> list[Any]:
        """Tool calls waiting for a person's approval, with their exact arguments."""
        from durably.agents import decisions

        return self._run(decisions.list_plan(self._ops, workflow_id, limit))
