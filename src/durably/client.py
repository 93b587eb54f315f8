"""Client: start and read workflows without ever executing one.

For command lines, web handlers and other services. A client never claims a
workflow: ``start`` commits a ``pending`` workflow that any engine (worker)
picks up. Its methods are synchronous; from async code, call them through
``asyncio.to_thread`` or use the Engine's async methods.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from durably import codec, errors, journal, step_runner, workflows
from durably.storage import base, create_store, dispatch, resolve_url

R = TypeVar("R")


class Client:
    """A connection to a durably database that reads and starts, but runs nothing."""

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_url(url)
        self._store = dispatch.StoreThread(create_store(self.url))
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

    # --- reading ------------------------------------------------------------------

    def schema_version(self) -> int:
        """The schema version of the database (migrating it first if behind)."""
        return self._call(self._store.store.schema_version)

    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo:
        """The workflow's row; WorkflowNotFound if there is none."""
        info = self._call(self._store.store.get_workflow, workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        return info

    def list_workflows(
        self, status: str | None = None, name: str | None = None, limit: int = 100
    ) -> list[journal.WorkflowInfo]:
        """Workflows, newest first, optionally filtered by status and workflow name."""
        if status is not None:
            status = journal.Status(status).value
        return self._call(self._store.store.list_workflows, status, name, limit)

    def history(self, workflow_id: str) -> list[journal.Entry]:
        """The workflow's journal in seq order."""
        self.get_workflow(workflow_id)
        return self._call(self._store.store.load_history, workflow_id)

    def claims(self, workflow_id: str) -> list[journal.Claim]:
        """Every change of owner of the workflow."""
        return self._call(self._store.store.load_claims, workflow_id)

    def executors(self) -> list[journal.ExecutorInfo]:
        """The executors registered in the database."""
        return self._call(self._store.store.list_executors)

    # --- starting -------------------------------------------------------------------

    def start(self, wf: Any, *args: Any, workflow_id: str | None = None, **kwargs: Any) -> str:
        """Commit a pending workflow for a worker to run; return its id.

        ``wf`` is a decorated workflow or its registered name. Idempotent on
        ``workflow_id`` like ``Engine.start``.
        """
        if isinstance(wf, str) and workflows.registered(wf) is None:
            name, version, source_hash = wf, None, None
        else:
            definition = workflows.definition_of(wf)
            name, version = definition.name, definition.version
            source_hash = definition.source_hash
        wid = workflows.new_workflow_id(workflow_id)
        payload = codec.encode(
            {"args": list(args), "kwargs": kwargs}, where=f"workflow {name!r} input"
        )
        new = base.NewWorkflow(wid, name, payload, version, source_hash)
        info, _ = self._call(
            self._store.store.create_workflow, new, None, None, time.time(), write=True
        )
        if info.name != name:
            raise errors.WorkflowIdConflict(
                f"workflow id {wid!r} already names a {info.name!r} workflow, not {name!r}"
            )
        return wid

    # --- signals, events, cancel, resume, fork ---------------------------------------

    def send_signal(
        self, workflow_id: str, name: str, payload: Any = None, idempotency_key: str | None = None
    ) -> bool:
        """Send a signal, committed before this returns; False if the key was used before."""
        data = codec.encode(payload, where=f"signal {name!r} payload")
        return self._call(
            self._store.store.send_signal,
            workflow_id,
            name,
            data,
            idempotency_key,
            time.time(),
            write=True,
        )

    def get_event(self, workflow_id: str, key: str, timeout: float | None = None) -> Any:
        """The value the workflow published under ``key``, waiting up to ``timeout`` for it."""
        deadline = time.monotonic() + (timeout or 0.0)
        delay = 0.01
        while True:
            value = self._call(self._store.store.get_event, workflow_id, key)
            if value is not None:
                return codec.decode(value, where=f"event {key!r} of {workflow_id!r}")
            if time.monotonic() >= deadline:
                self.get_workflow(workflow_id)
                raise TimeoutError(f"workflow {workflow_id!r} has not published {key!r}")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.25)

    def cancel(self, workflow_id: str) -> list[str]:
        """Ask the workflow and its unfinished children to stop; the ids asked."""
        return self._call(self._store.store.request_cancel, workflow_id, time.time(), write=True)

    def resume(self, workflow_id: str) -> None:
        """Make a failed, cancelled or diverged workflow run again from where it stopped."""
        self._call(self._store.store.reopen, workflow_id, time.time(), write=True)

    def fork(self, workflow_id: str, from_seq: int, new_id: str | None = None) -> str:
        """A new workflow with the first ``from_seq`` journal entries of this one; its id."""
        fork_id = new_id or f"{workflow_id}-fork-{uuid.uuid4().hex[:8]}"
        self._call(self._store.store.fork, workflow_id, from_seq, fork_id, time.time(), write=True)
        return fork_id

    def signals(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every signal sent to the workflow, consumed or not."""
        return self._call(self._store.store.list_signals, workflow_id)

    # --- the review queue -----------------------------------------------------------

    def reviews(self, workflow_id: str | None = None) -> list[journal.Review]:
        """Steps parked in ``needs_review``, oldest first."""
        return self._call(self._store.store.reviews, workflow_id)

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        *,
        result: Any = step_runner._MISSING,
        retry: bool = False,
        fail: str | None = None,
        by: str = "unknown",
    ) -> journal.Review:
        """Decide a parked step once: its ``result``, ``retry=True`` or ``fail="reason"``."""
        decision, outcome = step_runner.review_decision(result, retry, fail, by)
        return self._call(
            self._store.store.resolve,
            workflow_id,
            seq,
            decision,
            outcome,
            by,
            time.time(),
            write=True,
        )

    # --- approvals of agent tool calls --------------------------------------------------

    def approve(
        self,
        workflow_id: str,
        *,
        by: str,
        tool_call_id: str | None = None,
        override_args: Any = None,
        note: str = "",
    ) -> Any:
        """Approve the workflow's pending tool call (see :func:`durably.agents.approve`)."""
        from durably.agents import decisions

        return decisions.approve(
            self,
            workflow_id,
            by=by,
            tool_call_id=tool_call_id,
            override_args=override_args,
            note=note,
        )

    def reject(
        self, workflow_id: str, *, by: str, reason: str = "", tool_call_id: str | None = None
    ) -> Any:
        """Reject the workflow's pending tool call; the model reads the reason."""
        from durably.agents import decisions

        return decisions.reject(self, workflow_id, by=by, reason=reason, tool_call_id=tool_call_id)

    def list_approvals(self, workflow_id: str | None = None) -> list[Any]:
        """Tool calls waiting for a person's approval, with their exact arguments."""
        from durably.agents import decisions

        return decisions.list_approvals(self, workflow_id)
