"""The verbs that stop workflows: a cancel, and the deadlines that ask for one.

The last link of the chain that :class:`~durably.storage.sql.SqlStore` gathers,
kept here so that the verbs of one concern read together. What a cancel or a
deadline decides is in :mod:`durably.cancellation`; the SQL in ``queries.sql``
(``request_cancel``, ``cancel_unstarted``, ``due_deadlines``, ``cancels_asked``).
"""

from __future__ import annotations

from durably import cancellation, codec, errors, journal
from durably.storage import base, marks, reviews


class CancelVerbs(reviews.ReviewVerbs):
    """``request_cancel``, ``expire_deadlines`` and ``cancels_asked``, for
    :class:`~durably.storage.sql.SqlStore`."""

    @marks.alone
    def request_cancel(self, workflow_id: str, now: float) -> list[str]:
        if self.get_workflow(workflow_id) is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        cancelled: list[str] = []
        todo = [workflow_id]
        while todo:
            wid = todo.pop()
            if (
                self._cancel_unstarted(wid, now)
                or self._q("request_cancel", workflow_id=wid, now=now).rowcount == 1
            ):
                cancelled.append(wid)
                self._wake("cancel", wid)
            todo.extend(str(r[0]) for r in self._q("unfinished_children", workflow_id=wid))
        return cancelled

    @marks.alone
    def cancel_selected(self, query: base.WorkflowQuery, now: float) -> list[str]:
        """``request_cancel`` of what ``query`` selects as it goes (``_select_locked``), in
        id order, in this one transaction; the ids asked, children too, once each."""
        asked: list[str] = []
        for wid in sorted(self._select_locked(query)):
            asked += self.request_cancel(wid, now)
        return list(dict.fromkeys(asked))

    def _cancel_unstarted(self, workflow_id: str, now: float) -> bool:
        """End a workflow never claimed as cancelled (its code never runs); False if it
        was claimed (then the run receives the cancel at its next durable call)."""
        row = self.get_workflow(workflow_id)
        if row is None or row.status != journal.Status.PENDING or row.epoch != 0:
            return False
        error = cancellation.cancelled(workflow_id, "before it started", row.deadline_at, now)
        ended = self._q(
            "cancel_unstarted",
            workflow_id=workflow_id,
            error=codec.encode(codec.encode_error(error), where="workflow error"),
            now=now,
        ).fetchall()
        if not ended:
            return False
        parent_id = ended[0][0]
        if parent_id is not None:  # as finish_workflow: a parent joining it looks again
            self._q("wake_parent", parent_id=parent_id, now=now)
            self._wake("join", str(parent_id), name=workflow_id)
        return True

    @marks.alone
    def expire_deadlines(self, now: float, limit: int) -> list[str]:
        due = [str(r[0]) for r in self._pick("due_deadlines", now=now, limit=limit)]
        asked: list[str] = []
        for wid in due:
            asked.extend(self.request_cancel(wid, now))
        return list(dict.fromkeys(asked))

    def cancels_asked(self, owner: str) -> list[str]:
        return [str(r[0]) for r in self._q("cancels_asked", owner=owner)]
