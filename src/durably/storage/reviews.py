"""What people do to workflows: cancel, reopen, fork, and decide steps under review.

Unlike a run's writes these are not fenced by an epoch (no run holds the
workflow for them); the ones that decide on a workflow lock its row first.
Part of :class:`~durably.storage.sql.SqlStore`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from durably import errors, journal, replay
from durably.storage import base, marks, rows, signals


class ReviewVerbs(signals.SignalVerbs):
    """Operator verbs and reviews, for :class:`~durably.storage.sql.SqlStore`."""

    def reopen(self, workflow_id: str, now: float) -> journal.WorkflowInfo:
        info = self._lock_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        if info.status == journal.Status.PENDING and info.queue is not None:
            self._q("dequeue", workflow_id=workflow_id, now=now)  # not started: start it now
            self._wake("work")
            started = self.get_workflow(workflow_id)
            assert started is not None
            return started
        edit = replay.plan_reopen(workflow_id, info.status, self.load_history(workflow_id))
        if edit.delete_from is not None:
            self._q("delete_entries_from", workflow_id=workflow_id, seq=edit.delete_from)
            self._q("give_back_signals_from", workflow_id=workflow_id, seq=edit.delete_from)
            self._restore_intent(workflow_id, edit.delete_from, now)
        if edit.retry_seq is not None:
            self._q("retry_entry", workflow_id=workflow_id, seq=edit.retry_seq, now=now)
        self._q("reopen", workflow_id=workflow_id, now=now)
        self._wake("work")
        reopened = self.get_workflow(workflow_id)
        assert reopened is not None
        return reopened

    @marks.alone
    def resume_selected(self, query: base.WorkflowQuery, now: float) -> list[str]:
        """``reopen`` of what ``query`` selects as it goes (``_select_locked``), in id
        order, in this one transaction (one not resumable refuses all); the ids, in the
        query's order."""
        chosen = self._select_locked(query)
        for wid in sorted(chosen):
            self.reopen(wid, now)
        return chosen

    def _restore_intent(self, workflow_id: str, seq: int, now: float) -> None:
        """Put back the intent a cancel overwrote at ``seq`` while its step awaited review.

        That step's outcome is still unknown: the resumed run must ask again
        (reconcile, or the review, reopened) instead of running the step as new.
        """
        row = rows.first(self._q("cancelled_review_at", workflow_id=workflow_id, seq=seq))
        if row is None:
            return
        intent = journal.Entry(
            seq,
            journal.Kind.STEP,
            str(row["step"]),
            journal.EntryStatus.STARTED,
            int(row["attempt"]),
            row["intent"],
            float(row["opened_at"]),
        )
        self._upsert(workflow_id, [intent], now, None)

    def fork(
        self, workflow_id: str, from_seq: int, new_id: str, now: float
    ) -> journal.WorkflowInfo:
        # Locked: the journal checked below is the one copied (a run's commit waits).
        info = self._lock_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        self._refuse_open_step(workflow_id, from_seq)
        new = base.NewWorkflow(
            new_id,
            info.name,
            info.input,
            info.version,
            info.source_hash,
            max_recoveries=info.max_recoveries,
        )
        forked, created = self.create_workflow(new, None, None, now)
        if not created:
            raise errors.WorkflowIdConflict(f"workflow id {new_id!r} is already taken")
        self._q("copy_entries", new_id=new_id, workflow_id=workflow_id, seq=from_seq)
        self._q("copy_events", new_id=new_id, workflow_id=workflow_id, seq=from_seq, now=now)
        self._q("mark_fork", new_id=new_id, workflow_id=workflow_id, seq=from_seq)
        self._wake("work")
        return dataclasses.replace(forked, forked_from=workflow_id, forked_from_seq=from_seq)

    def _refuse_open_step(self, workflow_id: str, from_seq: int) -> None:
        """Raise NotForkable if the prefix holds a step whose outcome is open.

        Its idempotency key holds the source's id; in the fork it would be the fork's.
        Copied, an intent would be reconciled under a key never sent (a wrong NotFound
        runs it again) or reviewed for a call the fork never made, and a retry would
        send its next attempt under another key than the failed ones.
        """
        row = rows.first(self._q("first_open_step", workflow_id=workflow_id, seq=from_seq))
        if row is None:
            return
        seq, name, attempt = int(row["seq"]), str(row["name"]), int(row["attempt"])
        if row["status"] == journal.EntryStatus.STARTED:
            what = (
                f"has an intent without its receipt: its outcome is unknown (attempt "
                f"{attempt}: being called, reconciled, or awaiting review)"
            )
            settle = "once its outcome is recorded (it ends, or its review is decided)"
        else:
            what = f"failed attempt {attempt} and has its retry to come"
            settle = "once the step has ended"
        raise errors.NotForkable(
            f"cannot fork workflow {workflow_id!r} from seq {from_seq}: its step {name!r} "
            f"at seq {seq} {what}, and in the fork its idempotency key would be another. "
            f"Fork with from_seq={seq - 1} to run the step anew under the fork's key, or "
            f"fork {settle}"
        )

    def open_review(
        self,
        workflow_id: str,
        epoch: int,
        intent: journal.Entry,
        idempotency_key: str,
        reason: str,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> None:
        self._fenced_upsert(workflow_id, epoch, entries, now)
        self._q(
            "open_review",
            workflow_id=workflow_id,
            seq=intent.seq,
            attempt=intent.attempt,
            step=intent.name,
            idempotency_key=idempotency_key,
            intent=intent.payload,
            reason=reason,
            now=now,
        )

    def finish_closing_reviews(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        output: str | None,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> tuple[str, str | None]:
        ended = self.finish_workflow(workflow_id, epoch, status, output, error, entries, now)
        self.close_reviews(workflow_id, "ended", now)
        return ended

    def close_reviews(self, workflow_id: str, decided_by: str, now: float) -> int:
        closed = self._q(
            "close_open_reviews", workflow_id=workflow_id, decided_by=decided_by, now=now
        )
        return int(closed.rowcount or 0)

    def reviews(self, workflow_id: str | None) -> list[journal.Review]:
        return [
            journal.Review(**r)
            for r in rows.every(self._q("open_reviews", workflow_id=workflow_id))
        ]

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        decision: str,
        outcome: str | None,
        decided_by: str,
        now: float,
        attempt: int | None = None,
    ) -> journal.Review:
        # Decided under the workflow's row lock (SQLite: the write lock of BEGIN IMMEDIATE):
        # a rival resolver waits here, then finds the review decided.
        info = self._lock_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        open_ = [r for r in self.reviews(workflow_id) if r.seq == seq]
        status = journal.Status(info.status)
        if open_ and attempt is not None and open_[0].attempt != attempt:
            # Made for an earlier review at this seq (its retry ended unknown again and
            # opened this one): a duplicate of that decision must not decide this one.
            raise self._nothing_to_resolve(workflow_id, seq, info.status, attempt, open_[0])
        if open_ and status != journal.Status.NEEDS_REVIEW and not status.finished:
            # Opened by a run that has not parked for it yet (it parks once nothing else
            # of it can go on): that run still holds the workflow, so nothing decides.
            raise errors.NothingToResolve(
                f"workflow {workflow_id!r} is {info.status}: its review at seq {seq} can be "
                "decided once the workflow parks for it, which its run has not done yet"
            )
        if not open_ or status != journal.Status.NEEDS_REVIEW:
            raise self._nothing_to_resolve(workflow_id, seq, info.status, attempt)
        review = open_[0]
        entry = replay.resolved_entry(review, decision, outcome, now)
        decided = self._q(
            "decide_review",
            workflow_id=workflow_id,
            seq=seq,
            attempt=review.attempt,
            decision=decision,
            outcome=outcome,
            decided_by=decided_by,
            now=now,
        )
        if decided.rowcount != 1:  # only if a dialect let a rival in past the row lock
            raise self._nothing_to_resolve(workflow_id, seq, info.status, attempt)
        # Unfenced (a person decides, no run holds the workflow): resets no crash count.
        self._upsert(workflow_id, [entry], now, None)
        self._q("review_decided", workflow_id=workflow_id, now=now)
        self._wake("work")
        return dataclasses.replace(
            review, decision=decision, outcome=outcome, decided_by=decided_by, decided_at=now
        )

    def _nothing_to_resolve(
        self,
        workflow_id: str,
        seq: int,
        status: str,
        attempt: int | None,
        open_: journal.Review | None = None,
    ) -> errors.DurablyError:
        """Why there is nothing to decide at ``seq`` (for ``attempt``, when given): who
        decided it, if anyone did, and which review is open there now, if one is."""
        which = f"seq {seq}" if attempt is None else f"seq {seq} attempt {attempt}"
        now_open = (
            ""
            if open_ is None
            else f"; the review open there now is attempt {open_.attempt} (a later run of "
            f"the step, its outcome unknown again), decided only by a decision naming it"
        )
        row = self._q("review_at", workflow_id=workflow_id, seq=seq, attempt=attempt).fetchone()
        if row is not None:
            decision, by, at = row
            when = datetime.datetime.fromtimestamp(float(at), datetime.UTC).isoformat(
                timespec="seconds"
            )
            return errors.AlreadyResolved(
                f"workflow {workflow_id!r} has no step awaiting a decision at {which}: it "
                f"was decided already ({decision} by {by!r} at {when}){now_open}"
            )
        return errors.NothingToResolve(
            f"workflow {workflow_id!r} ({status}) has no step awaiting a decision at "
            f"{which}{now_open}"
        )
