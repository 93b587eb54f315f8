"""The Engine's calls that read or change many workflows at once.

Listing with filters and pages, signals sent in one transaction, and cancel,
resume and delete by filter: a part of :class:`~durably.engine.Engine` kept here
so that the engine's module holds its run loop. Each call is a plan of
:mod:`durably.operations` (the Client's too), run on the engine's store.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from durably import journal, operations
from durably.storage import base

R = TypeVar("R")


class ManyWorkflows:
    """Engine calls on many workflows; the Engine supplies the plan runner and wake-ups."""

    _ops: operations.Operations

    async def _run(self, plan: operations.Plan[R]) -> R:
        raise NotImplementedError

    def _on_wakeup(self, wakeup: base.Wakeup) -> None:
        raise NotImplementedError

    def _kick_recovery(self) -> None:
        raise NotImplementedError

    async def list_workflows(
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
        return await self._run(self._ops.list_workflows(status, name, limit, **filters))

    async def send_signals(self, signals: Sequence[tuple[Any, ...]]) -> list[bool]:
        """Send several signals in one transaction: all are kept, or none is.

        Each is ``(workflow_id, name[, payload[, idempotency_key]])``; the answer
        says, for each, whether it was kept (False: its key was used before).
        """
        signals = list(signals)  # read twice: sent, then woken
        sent = await self._run(self._ops.send_signals(signals))
        for given, kept in zip(signals, sent, strict=True):
            if kept:
                self._on_wakeup(base.Wakeup("signal", given[0], given[1]))
        return sent

    async def cancel_workflows(self, **filters: Any) -> list[str]:
        """Cancel every workflow the filters select (those of ``list_workflows`` but the
        paging ones; at least one), in one transaction; the ids asked to stop."""
        asked = await self._run(self._ops.cancel_many(filters))
        for wid in asked:
            self._on_wakeup(base.Wakeup("cancel", wid))
        return asked

    async def resume_workflows(self, **filters: Any) -> list[str]:
        """Resume every workflow the filters select (at least one), all or none; the ids.

        Each must be resumable: filter by ``status`` (``failed``, ``cancelled``...).
        """
        resumed = await self._run(self._ops.resume_many(filters))
        self._kick_recovery()
        return resumed

    async def delete(self, *workflow_ids: str, force: bool = False) -> list[str]:
        """Remove workflows with their children, journals and every row naming them.

        All or none; the ids removed. An unfinished one raises WorkflowNotFinished
        (cancel it first) unless ``force``: its owner, if running, is fenced out.
        """
        return await self._run(self._ops.delete(workflow_ids, force))

    async def delete_workflows(self, *, force: bool = False, **filters: Any) -> list[str]:
        """``delete`` every workflow the filters select (at least one), all or none."""
        return await self._run(self._ops.delete_many(filters, force))
