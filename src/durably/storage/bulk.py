"""Verbs on whole workflows: export them, import them, prune the finished ones.

A workflow is its row in ``workflows`` and its rows in the side tables that
name it (:data:`COLUMNS`). The executors and queues tables describe the
processes and limits of one deployment, not a workflow, and are never moved
or pruned. The SQL is in ``queries.sql`` (``export_*``, ``import_*``,
``prune_*``), written once for both dialects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from durably import errors, journal
from durably.storage import marks, rows, sqlbase

#: Every table holding a workflow's rows, with its columns in the order the export and
#: import queries list them. ``workflows`` first: the side rows come with their workflow.
COLUMNS: dict[str, tuple[str, ...]] = {
    "workflows": (
        "workflow_id", "name", "version", "source_hash", "status", "input", "output", "error",
        "owner", "epoch", "lease_expires_at", "crash_count", "wake_at", "parent_id",
        "created_at", "updated_at", "cancel_requested", "signal_count", "queue", "priority",
        "deduplication_id", "started_at", "forked_from", "forked_from_seq", "max_recoveries",
        "partition_key", "debounce_key", "warnings", "deadline_at",
    ),
    "journal": (
        "workflow_id", "seq", "kind", "name", "status", "attempt", "payload", "started_at",
        "finished_at", "wake_at", "args_digest", "follows",
    ),
    "claims": ("workflow_id", "epoch", "owner", "claimed_at", "previous_owner", "reason"),
    "signals": (
        "workflow_id", "num", "name", "payload", "idempotency_key", "sent_at", "consumed_seq",
    ),
    "events": ("workflow_id", "key", "value", "seq", "updated_at"),
    "reviews": (
        "workflow_id", "seq", "attempt", "step", "idempotency_key", "intent", "reason",
        "opened_at", "decision", "outcome", "decided_by", "decided_at",
    ),
}  # fmt: skip

#: Columns added after archives were first written (NULL when absent): an archive made by
#: an older durably still imports.
LATER_COLUMNS: dict[str, frozenset[str]] = {
    "workflows": frozenset(
        {
            "forked_from",
            "forked_from_seq",
            "max_recoveries",
            "partition_key",
            "debounce_key",
            "warnings",
            "deadline_at",
        }
    ),
    "journal": frozenset({"args_digest", "follows"}),
}

#: Tables of the schema that belong to no workflow (see the module docstring).
NOT_PER_WORKFLOW = frozenset({"executors", "queues", "durably_migrations"})


@dataclasses.dataclass(frozen=True)
class ArchivedWorkflow:
    """One workflow's rows, table by table, as column-name dicts (``workflows``: one row).

    ``where`` says where it came from in messages (an archive's file and line).
    """

    rows: dict[str, list[dict[str, Any]]]
    where: str = ""

    @property
    def workflow_id(self) -> str:
        return str(self.rows["workflows"][0]["workflow_id"])


class BulkVerbs(sqlbase.SqlBase):
    """Export, import and prune, for :class:`~durably.storage.sql.SqlStore`."""

    def _lock_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        """The workflow's row, locked until the transaction ends where the dialect needs a
        row lock (``lock_row``); a rival deciding on the same workflow waits for it."""
        sql_text = self._queries["get_workflow"] + self.lock_row
        row = rows.first(self._execute(sql_text, {"workflow_id": workflow_id}))
        return rows.workflow(row) if row else None

    def export_ids(self, status: str | None, since: float | None) -> list[str]:
        """The ids an export selects (every workflow when both are None), oldest first."""
        rows = self._q("export_ids", status=status, since=since).fetchall()
        return [str(r[0]) for r in rows]

    def export_workflows(self, workflow_ids: Sequence[str]) -> list[ArchivedWorkflow]:
        """The workflows with every row that names them, and their children's, recursively.

        Read in one transaction and one snapshot (a PostgreSQL statement would otherwise
        see what was committed since the one before: a signal consumed at a journal
        entry that the journal read before it lacked), so they are consistent; an id
        that does not exist raises WorkflowNotFound.
        """
        self._read_one_snapshot()
        out: list[ArchivedWorkflow] = []
        seen: set[str] = set()
        todo = list(workflow_ids)
        while todo:
            wid = todo.pop(0)
            if wid in seen:
                continue
            seen.add(wid)
            rows = {table: self._rows(f"export_{table}", wid) for table in COLUMNS}
            if not rows["workflows"]:
                raise errors.WorkflowNotFound(f"no workflow with id {wid!r} in {self.url}")
            out.append(ArchivedWorkflow(rows))
            todo.extend(str(r[0]) for r in self._q("export_children", workflow_id=wid))
        return out

    def _rows(self, query: str, workflow_id: str) -> list[dict[str, Any]]:
        cursor = self._q(query, workflow_id=workflow_id)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]

    @marks.alone
    def import_workflows(self, workflows: Sequence[ArchivedWorkflow]) -> list[str]:
        """Insert the workflows, all or none (one transaction), without owners.

        An id already present refuses the whole import (WorkflowIdConflict); a row
        the database refuses raises ArchiveError naming where it came from.
        """
        for wf in workflows:
            if self.get_workflow(wf.workflow_id) is not None:
                raise errors.WorkflowIdConflict(
                    f"{wf.where}: workflow {wf.workflow_id!r} already exists in {self.url}; "
                    "nothing was imported (prune or delete it first, or leave it out)"
                )
            for table, table_rows in wf.rows.items():
                for row in table_rows:
                    try:
                        self._q(f"import_{table}", **row)
                    except self.driver_errors as exc:
                        raise errors.ArchiveError(
                            f"{wf.where}: {table} row of workflow {wf.workflow_id!r} was "
                            f"refused by {self.url} ({self._translate(exc)}); "
                            "nothing was imported"
                        ) from None
        if workflows:
            self._wake("work")
        return [wf.workflow_id for wf in workflows]

    @marks.alone
    def prune(self, before: float, status: str | None, limit: int) -> list[str]:
        """Remove up to ``limit`` finished workflows last changed before ``before`` (one
        transaction: one bounded batch), with every row that names them.

        Never an unfinished workflow (its status is checked again as it is
        deleted), nor a child whose parent is still there (it goes in a later batch),
        nor a parent with an unfinished child (checked again too: it goes once they
        have finished, so no child names a parent that is gone).
        """
        if status is not None and status not in journal.FINISHED_STATUSES:
            finished = ", ".join(journal.FINISHED_STATUSES)
            raise errors.NotAFinishedStatus(
                f"status {status!r} is not a finished status; only {finished} workflows are pruned"
            )
        picked = self._execute(
            self._queries["prunable"] + self.skip_locked,
            {"status": status, "before": before, "limit": limit},
        ).fetchall()
        # the rows first (finished, checked again), then every row naming those removed:
        # a statement per table and IDS_PER_STATEMENT workflows
        removed = {str(r[0]) for r in self._each_listed("prune_workflows", [r[0] for r in picked])}
        pruned = [str(wid) for (wid,) in picked if str(wid) in removed]
        self._prune_rows_of(pruned)
        return pruned

    def _prune_rows_of(self, workflow_ids: Sequence[str]) -> None:
        """Delete every side table's rows of these removed workflows, and give the pages
        back where the dialect can."""
        if not workflow_ids:
            return
        for table in COLUMNS:
            if table != "workflows":
                self._each_listed(f"prune_{table}", workflow_ids)
        self._reclaim_space()

    @marks.alone
    def delete_workflows(self, workflow_ids: Sequence[str], force: bool) -> list[str]:
        """Remove the workflows with their children, recursively, and every row naming
        them (the prune queries), all or none; the ids removed, parents first.

        Without ``force``: only finished workflows (checked again as each row goes),
        no child whose parent stays unfinished (its join would wait forever), and no
        parent with an unfinished child (WorkflowHasUnfinishedChildren).
        """
        chosen = sorted(set(workflow_ids))  # locked in id order by every caller
        order: list[str] = []
        todo = list(chosen)
        while todo:
            wid = todo.pop(0)
            if wid in order:
                continue
            # locked before its children are read: a run adding one fences this row first
            info = self._lock_workflow(wid)
            if info is None:
                raise errors.WorkflowNotFound(
                    f"no workflow with id {wid!r} in {self.url}; nothing was deleted"
                )
            if not force:
                self._check_deletable(info, order)
            order.append(wid)
            todo.extend(str(r[0]) for r in self._q("export_children", workflow_id=wid))
        for wid in order:
            if self._q("delete_workflow", workflow_id=wid, force=int(force)).rowcount != 1:
                raise errors.WorkflowNotFinished(
                    f"workflow {wid!r} changed while being deleted (it is no longer "
                    "finished); nothing was deleted"
                )
        self._prune_rows_of(order)
        return order

    def _check_deletable(self, info: journal.WorkflowInfo, chosen: Sequence[str]) -> None:
        """Refuse, without ``force``, an unfinished workflow, or a child whose unfinished
        parent (not deleted with it) would wait for it forever. An unfinished child
        reached from a parent being deleted names both (WorkflowHasUnfinishedChildren)."""
        if not info.finished and info.parent_id in chosen:
            raise errors.WorkflowHasUnfinishedChildren(
                f"workflow {info.parent_id!r} has a child {info.workflow_id!r} that is still "
                f"{info.status}: a workflow is deleted with its children, so it is kept "
                "until they have finished (wait for it, cancel it, or force it); nothing "
                "was deleted"
            )
        if not info.finished:
            raise errors.WorkflowNotFinished(
                f"workflow {info.workflow_id!r} is {info.status}: only a finished workflow "
                "is deleted (cancel it first, or force it); nothing was deleted"
            )
        if info.parent_id is not None and info.parent_id not in chosen:
            parent = self.get_workflow(info.parent_id)
            if parent is not None and not parent.finished:
                raise errors.WorkflowNotFinished(
                    f"workflow {info.workflow_id!r} is a child of {parent.workflow_id!r}, "
                    f"which is {parent.status} and may wait for it: delete the parent, or "
                    "force it; nothing was deleted"
                )

    def _reclaim_space(self) -> None:
        """Give the pages that pruning freed back to the file system, where the dialect can
        (SQLite's incremental vacuum); PostgreSQL's autovacuum does it by itself."""
