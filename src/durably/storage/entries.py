"""Journal writes under the fence: append entries, finish a workflow, park it.

Every write of a run goes through ``_fence``, which checks the run's epoch
still owns the workflow, then ``_upsert``, which writes entries idempotently
(a commit repeated after a lost COMMIT finds its own entries). Part of
:class:`~durably.storage.sql.SqlStore`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from durably import cancellation, codec, errors, journal, validate
from durably.storage import claims, marks, rows


@dataclasses.dataclass(slots=True)
class Fence:
    """What the fence found on the workflow's row: the write may go on at this epoch.

    ``crash_count`` is the crashes in a row a recovery left counted; the first new
    final entry written under this fence resets them (and zeroes this field).
    """

    workflow_id: str
    epoch: int
    cancel_requested: bool
    crash_count: int
    deadline_at: float | None = None

    def asked(self, now: float) -> bool:
        """True when the workflow must stop: cancel was requested or its deadline passed."""
        return cancellation.asked(self.cancel_requested, self.deadline_at, now)


def entry_params(workflow_id: str, e: journal.Entry) -> dict[str, object]:
    """The parameters of an entry's write (``upsert_entry``, ``fence_and_write_entry``)."""
    return {
        "workflow_id": workflow_id,
        "seq": e.seq,
        "kind": e.kind,
        "name": e.name,
        "status": e.status,
        "attempt": e.attempt,
        "payload": e.payload,
        "started_at": e.started_at,
        "finished_at": e.finished_at,
        "wake_at": e.wake_at,
        "args_digest": e.args_digest,
        "follows": e.follows,
    }


#: Entry kinds whose write is followed by another statement (``_wrote``).
_WRITE_MORE = frozenset({journal.Kind.CANCEL, journal.Kind.EVENT})
#: The usual entry kind, which writes nothing after its upsert (``_wrote``).
_STEP = journal.Kind.STEP


class EntryVerbs(claims.ClaimVerbs):
    """The journal and the fenced writes, for :class:`~durably.storage.sql.SqlStore`."""

    @marks.one_read
    def load_history(self, workflow_id: str) -> list[journal.Entry]:
        return [rows.entry(r) for r in rows.every(self._q("load_history", workflow_id=workflow_id))]

    @marks.one_read
    def history_page(
        self, workflow_id: str, after_seq: int | None, before_seq: int | None, limit: int
    ) -> list[journal.Entry]:
        if after_seq is not None:
            found = self._q(
                "history_page_oldest_first", workflow_id=workflow_id, seq=after_seq, limit=limit
            )
            return [rows.entry(r) for r in rows.every(found)]
        # the newest: before the largest seq a BIGINT holds, which no run's count of calls reaches
        seq = validate.BIGINT[1] if before_seq is None else before_seq
        found = self._q("history_page", workflow_id=workflow_id, seq=seq, limit=limit)
        return [rows.entry(r) for r in reversed(rows.every(found))]

    @marks.one_read
    def history_steps(self, workflow_id: str, name_prefix: str) -> list[journal.Entry]:
        found = self._q("history_steps", workflow_id=workflow_id, name_prefix=name_prefix)
        return [rows.entry(r) for r in rows.every(found)]

    @marks.one_read
    def history_mark(self, workflow_id: str) -> journal.HistoryMark:
        found = self._q("history_mark", workflow_id=workflow_id).fetchall()
        (_, entries, last_seq, _), (_, signals, _, _) = found[:2]
        opened = tuple(
            (int(seq), str(status), int(attempt)) for _, seq, attempt, status in found[2:]
        )
        return journal.HistoryMark(
            int(entries), None if last_seq is None else int(last_seq), opened, int(signals)
        )

    def _fence(self, workflow_id: str, epoch: int, now: float) -> Fence:
        """Check the epoch still owns the workflow (locking its row); return what it found.

        A plain SELECT (``FOR UPDATE`` where the dialect needs a row lock), so a
        step's commit writes no workflow page. A parked or finished workflow has
        no owner, so nothing more is written to it at that epoch. When a
        recovery left crashes counted, the first new final entry resets them
        (see ``_upsert``): intents, parks and pending waits are not progress.
        """
        sql_text = self._queries["fence"] + self.lock_row
        # Read by position, on every commit: the fence's own three columns, in this order.
        found = self._execute(sql_text, {"workflow_id": workflow_id, "epoch": epoch}).fetchone()
        if found is None:
            raise self._fenced_off(workflow_id, epoch)
        cancel_requested, crash_count, deadline_at = found
        return Fence(workflow_id, epoch, bool(cancel_requested), int(crash_count), deadline_at)

    def _fenced_off(self, workflow_id: str, epoch: int) -> errors.DurablyError:
        """Why the fence did not hold: the workflow is gone, or another epoch owns it."""
        row = rows.first(self._q("owner_of", workflow_id=workflow_id))
        if row is None:
            return errors.WorkflowNotFound(f"no workflow {workflow_id!r} in {self.url}")
        return errors.FencedError(
            f"workflow {workflow_id!r} is now at epoch {row['epoch']} (owner {row['owner']}, "
            f"status {row['status']}); this executor held epoch {epoch} and must stop"
        )

    def _fence_and_write(
        self, workflow_id: str, epoch: int, entry: journal.Entry, now: float, *, whole: bool
    ) -> tuple[Fence, int | None]:
        """The fence, and the write of ``entry`` under it where the dialect does both in
        one statement: (what the fence found, how many rows the write changed), or with
        None when the entry is not written yet (the caller writes it). ``whole``: that
        statement is all the verb writes (the dialect may send it as its own transaction).

        Here, the fence alone: an embedded database has no round trip to save.
        PostgreSQL overrides it (``fence_and_write_entry``).
        """
        return self._fence(workflow_id, epoch, now), None

    def _fenced_upsert(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        now: float,
        *,
        last: bool = False,
    ) -> Fence:
        """``_fence`` then ``_upsert``, the fence and the first entry's write in one
        statement where the dialect can (a step's commit: one round trip). ``last``: the
        verb writes nothing after these entries."""
        if not entries:
            return self._fence(workflow_id, epoch, now)
        first = entries[0]
        # what _wrote does after a cancel or an event entry writes more: not the whole verb
        whole = last and len(entries) == 1 and first.kind not in _WRITE_MORE
        fence, written = self._fence_and_write(workflow_id, epoch, first, now, whole=whole)
        if written is None:
            self._upsert(workflow_id, entries, now, fence)
        else:
            self._wrote(workflow_id, entries[0], written, now, fence)
            self._upsert(workflow_id, entries[1:], now, fence)
        return fence

    def _upsert(
        self,
        workflow_id: str,
        entries: Sequence[journal.Entry],
        now: float,
        fence: Fence | None,
    ) -> None:
        """Write entries; under a ``fence``, the first new final one resets counted crashes."""
        upsert = self._queries["upsert_entry"]
        for e in entries:
            cursor = self._execute(upsert, entry_params(workflow_id, e))
            self._wrote(workflow_id, e, cursor.rowcount, now, fence)

    def _wrote(
        self, workflow_id: str, e: journal.Entry, written: int, now: float, fence: Fence | None
    ) -> None:
        """What follows the upsert of ``e`` that changed ``written`` rows: progress, or a
        refusal unless the journal already holds this very entry; a cancel closes the
        review it ends, an event is published."""
        if written == 1 and e.status in journal.FINAL_ENTRY_STATUSES:
            if fence is not None and fence.crash_count:  # progress: crashes in a row end here
                fence.crash_count = 0
                self._q("progress", workflow_id=fence.workflow_id, epoch=fence.epoch, now=now)
        elif written != 1 and not self._holds(workflow_id, e):
            raise errors.StoreError(
                f"workflow {workflow_id!r} seq {e.seq} already holds a final or a "
                f"different entry; refusing to overwrite it with {e.describe()}"
            )
        kind = e.kind
        if kind is _STEP:  # the usual entry: nothing more to write
            return
        if kind == journal.Kind.CANCEL:  # a step awaiting review will not be decided
            self._q(
                "decide_review",
                workflow_id=workflow_id,
                seq=e.seq,
                attempt=None,  # whichever is open there
                decision="cancelled",
                outcome=None,
                decided_by="cancel",
                now=now,
            )
        if kind == journal.Kind.EVENT and e.payload is not None:
            self._publish_event(workflow_id, e.name, e.payload, e.seq, now)

    def _publish_event(self, workflow_id: str, key: str, value: str, seq: int, now: float) -> None:
        """Set an event's value, and wake who waits for it in ``get_event``: a parked
        reader is due now, a running one's executor is told (``Wakeup`` ``event``)."""
        self._q("publish_event", workflow_id=workflow_id, key=key, value=value, seq=seq, now=now)
        label = f"{key} of {workflow_id}"
        if self._q("wake_event_readers", label=label, now=now).rowcount:
            self._wake("work")  # a parked reader is due
        self._wake("event", workflow_id, name=key)

    def _entry_at(self, workflow_id: str, seq: int) -> journal.Entry | None:
        row = rows.first(self._q("entry_at", workflow_id=workflow_id, seq=seq))
        return None if row is None else rows.entry(row)

    def _holds(self, workflow_id: str, entry: journal.Entry) -> bool:
        """True if the journal already holds this very entry (a commit repeated because
        the first one's outcome was unknown, its connection lost at COMMIT)."""
        found = self._entry_at(workflow_id, entry.seq)
        return found is not None and (
            found.kind,
            found.name,
            found.status,
            found.attempt,
            found.payload,
        ) == (entry.kind, entry.name, entry.status, entry.attempt, entry.payload)

    def _final_at(self, workflow_id: str, seq: int) -> journal.Entry | None:
        found = self._entry_at(workflow_id, seq)
        return found if found is not None and found.status in journal.FINAL_ENTRY_STATUSES else None

    def append_entries(
        self, workflow_id: str, epoch: int, entries: Sequence[journal.Entry], now: float
    ) -> bool:
        fence = self._fenced_upsert(workflow_id, epoch, entries, now, last=True)
        return fence.asked(now)

    def finish_workflow(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        output: str | None,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> tuple[str, str | None]:
        outcome = {"output": output, "now": now, "workflow_id": workflow_id, "epoch": epoch}
        found = None
        if not entries:  # the usual end: fenced and finished in one statement
            found = self._finish_at_once(status, error, **outcome)
        if found is None:  # entries to write first, or fenced off, or asked to stop
            status, error = self._fenced_end(workflow_id, epoch, status, error, entries, now)
            found = self._finish_row(status, error, fenced=0, **outcome)
        parent_id, queue = found
        if parent_id is not None:
            self._q("wake_parent", parent_id=parent_id, now=now)
            self._wake("join", str(parent_id), name=workflow_id)
        if queue is not None:
            self._wake("work")  # a place in its queue is free
        return status, error

    def _finish_at_once(self, status: str, error: str | None, **params: Any) -> Any:
        """The usual end, fenced and finished in one statement (``_finish_row`` with
        ``fenced``): the (parent_id, queue) left to wake, or None if the fence did not hold.
        A dialect may wake them in the same statement (and return none left)."""
        return self._finish_row(status, error, fenced=1, **params)

    def _finish_row(self, status: str, error: str | None, **params: Any) -> Any:
        """``finish_workflow``: its (parent_id, queue), or None if ``fenced`` found the
        workflow not this epoch's or asked to stop."""
        return self._q("finish_workflow", status=status, error=error, **params).fetchone()

    def _fenced_end(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> tuple[str, str | None]:
        """Fence and write ``entries``; the status and error to finish with: ``cancelled``
        for a workflow that completed after a cancel was committed (its output kept)."""
        fence = self._fenced_upsert(workflow_id, epoch, entries, now)
        final = cancellation.final_status(status, fence.cancel_requested, fence.deadline_at, now)
        if final == status:
            return status, error
        late = cancellation.cancelled(
            workflow_id, "after its last durable call", fence.deadline_at, now
        )
        return final, codec.encode(codec.encode_error(late), where="workflow error")

    # --- waiting ------------------------------------------------------------------------

    def park(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        wake_at: float | None,
        entries: Sequence[journal.Entry],
        signals: Sequence[str],
        children: Sequence[str],
        now: float,
    ) -> bool:
        fence = self._fenced_upsert(workflow_id, epoch, entries, now)
        for name in signals:
            if self._q("next_signal", workflow_id=workflow_id, name=name).fetchone():
                return False
        for child_id in children:
            child = self.get_workflow(child_id)
            if child is None or child.finished:
                return False
        if fence.asked(now) and not self._q("cancel_delivered", workflow_id=workflow_id).fetchone():
            wake_at = now  # asked to stop meanwhile: due at once, so a claim delivers it
        (queue,) = self._q(
            "park", status=status, wake_at=wake_at, now=now, workflow_id=workflow_id, epoch=epoch
        ).fetchone()
        if wake_at is not None:
            self._wake("timer", at=wake_at)
        if queue is not None:
            self._wake("work")  # a place in its queue is free
        return True

    @marks.one_read
    def next_wake(self) -> float | None:
        row = self._q("next_wake").fetchone()
        return None if row is None or row[0] is None else float(row[0])
