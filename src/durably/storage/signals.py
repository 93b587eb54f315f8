"""Signals, events and children: what a parked workflow waits for, and how it gets it.

``receive_signal``, ``join_child`` and the messaging verbs of workflow code
(``post_signal``, ``read_event``) settle a wait's entry under the fence,
idempotently; ``send_signal`` stores a signal and makes its waiting workflow
claimable. Part of :class:`~durably.storage.sql.SqlStore`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from durably import cancellation, codec, errors, journal, replay, validate
from durably.storage import base, entries, marks


@dataclasses.dataclass(frozen=True, slots=True)
class KeptSignal:
    """What sending a signal found: the workflow's status (None: no such workflow), and
    whether the key was used before, the workflow had ended, or the signal was kept."""

    status: str | None
    duplicate: bool = False
    finished: bool = False
    kept: bool = False


class SignalVerbs(entries.EntryVerbs):
    """Signals, events and child workflows, for :class:`~durably.storage.sql.SqlStore`."""

    def _settle_wait(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
        outcome: Callable[[], journal.Entry],
    ) -> journal.Entry:
        """The shared shape of receive_signal and join_child: fenced, idempotent.

        A wait already final (its first commit's outcome was unknown to the
        caller) is returned as it is; otherwise ``outcome()`` decides what to write.
        """
        fence = self._fence(workflow_id, epoch, now)
        done = self._final_at(workflow_id, wait.seq)
        if done is not None:
            self._upsert(workflow_id, entries, now, fence)
            return done
        final = outcome()
        self._upsert(workflow_id, [*entries, final], now, fence)
        return final

    def receive_signal(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        fence, done, signal = self._fence_and_look(workflow_id, epoch, wait, now)
        self._upsert(workflow_id, entries, now, fence)
        if done is not None:  # settled by an earlier commit whose outcome was not known
            return done
        final = replay.signal_outcome(wait, None if signal is None else signal[1], now)
        num = None if signal is None else signal[0]
        self._consume_and_write(workflow_id, num, final, now, fence)
        return final

    def _fence_and_look(
        self, workflow_id: str, epoch: int, wait: journal.Entry, now: float
    ) -> tuple[entries.Fence, journal.Entry | None, tuple[int, str] | None]:
        """The fence; the wait's entry if it is final already; else the oldest signal of its
        name not yet received, as (number, payload). A dialect may do it in one statement."""
        fence = self._fence(workflow_id, epoch, now)
        done = self._final_at(workflow_id, wait.seq)
        if done is not None:
            return fence, done, None
        found = self._q("next_signal", workflow_id=workflow_id, name=wait.name).fetchone()
        return fence, None, None if found is None else (int(found[0]), str(found[1]))

    def _consume_and_write(
        self,
        workflow_id: str,
        num: int | None,
        final: journal.Entry,
        now: float,
        fence: entries.Fence,
    ) -> None:
        """Mark signal ``num`` (if any) received by the wait, and write the wait's entry. A
        dialect may do both in one statement."""
        if num is not None:
            self._q("consume_signal", workflow_id=workflow_id, num=num, seq=final.seq)
        self._upsert(workflow_id, [final], now, fence)

    def send_signal(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
        now: float,
        *,
        tell: bool = True,
    ) -> bool:
        return self._send_signal(
            workflow_id, name, payload, idempotency_key, now, whole=True, tell=tell
        )

    def tell_signal(self, workflow_id: str, name: str) -> None:
        self._wake("signal", workflow_id, name=name)

    def _send_one_of_many(
        self, workflow_id: str, name: str, payload: str, idempotency_key: str | None, now: float
    ) -> bool:
        return self._send_signal(workflow_id, name, payload, idempotency_key, now, whole=False)

    def _send_signal(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
        now: float,
        *,
        whole: bool,
        tell: bool = True,
    ) -> bool:
        """``send_signal``; ``whole`` when it is all the verb writes (not a workflow's send);
        ``tell``: send the wake-up."""
        kept = self._keep_signal(
            workflow_id, name, payload, idempotency_key, now, whole=whole, tell=tell
        )
        return self._signal_sent(workflow_id, name, kept)

    def _signal_sent(self, workflow_id: str, name: str, kept: KeptSignal) -> bool:
        """Whether the signal was kept (False: a duplicate); raises where it could not be."""
        if kept.status is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        if kept.duplicate:
            return False
        if kept.finished:
            raise errors.WorkflowFinished(
                f"workflow {workflow_id!r} is {kept.status}: signal {name!r} could never be "
                "received, so it was not kept"
            )
        return kept.kept

    def _keep_signal(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
        now: float,
        *,
        whole: bool,
        tell: bool = True,
    ) -> KeptSignal:
        """Number and keep the signal, wake its workflow (with ``tell``, listening executors
        too); what was found. A dialect may do it in one statement (``whole``: nothing else
        is written in the transaction)."""
        # Under the workflow's row lock, so of two senders of one key the second sees the
        # first's signal; ON CONFLICT in insert_signal is the backstop.
        target = self._lock_workflow(workflow_id)
        if target is None:
            return KeptSignal(None)
        if idempotency_key is not None:
            dup = self._q(
                "signal_by_key", workflow_id=workflow_id, idempotency_key=idempotency_key
            ).fetchone()
            if dup is not None:
                return KeptSignal(target.status, duplicate=True)
        if target.finished:
            return KeptSignal(target.status, finished=True)
        rows = self._q("count_signal", workflow_id=workflow_id, now=now).fetchall()
        inserted = self._q(
            "insert_signal",
            workflow_id=workflow_id,
            num=int(rows[0][0]),
            name=name,
            payload=payload,
            idempotency_key=idempotency_key,
            now=now,
        )
        if inserted.rowcount != 1:
            return KeptSignal(target.status, duplicate=True)
        if tell:
            self.tell_signal(workflow_id, name)
        return KeptSignal(target.status, kept=True)

    @marks.one_read
    def get_event(self, workflow_id: str, key: str) -> str | None:
        row = self._q("get_event", workflow_id=workflow_id, key=key).fetchone()
        return None if row is None else str(row[0])

    @marks.one_read
    def live_events(self, key: str, limit: int) -> list[tuple[str, str]]:
        found = self._q("live_events", key=key, limit=limit).fetchall()
        return [(str(workflow_id), str(value)) for _, workflow_id, value, _ in found]

    def add_warning(self, workflow_id: str, text: str) -> None:
        row = self._q("warnings_of", workflow_id=workflow_id).fetchone()
        if row is None:
            return
        lines = str(row[0]).splitlines() if row[0] is not None else []
        line = " ".join(text.splitlines())
        if line in lines:
            return
        kept = [*lines, line][-base.MAX_WARNINGS :]
        self._q("set_warnings", workflow_id=workflow_id, warnings="\n".join(kept))

    def post_signal(
        self,
        workflow_id: str,
        epoch: int,
        send: journal.Entry,
        entries: Sequence[journal.Entry],
        target: str,
        name: str,
        payload: str,
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            key = f"{workflow_id}:{send.seq}"
            try:
                self._send_signal(target, name, payload, key, now, whole=False)
            except (errors.WorkflowNotFound, errors.WorkflowFinished) as exc:
                error = {"type": f"durably.errors.{type(exc).__name__}", "message": str(exc)}
                return replay.sent_outcome(send, json.dumps(error), now)
            return replay.sent_outcome(send, None, now)

        return self._settle_wait(workflow_id, epoch, send, entries, now, outcome)

    def read_event(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        source: str,
        key: str,
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            return replay.signal_outcome(wait, self.get_event(source, key), now)

        return self._settle_wait(workflow_id, epoch, wait, entries, now, outcome)

    def commit_receipt(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> bool:
        fence = self._fenced_upsert(workflow_id, epoch, entries, now, last=not events)
        seq = entries[-1].seq
        for key, value in events:
            self._publish_event(workflow_id, key, value, seq, now)
        return fence.asked(now)

    def decide_race(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        losers: Sequence[tuple[int, str]],
        now: float,
    ) -> bool:
        fence = self._fenced_upsert(workflow_id, epoch, entries, now)
        for seq, name in losers:
            self._q("give_back_signal", workflow_id=workflow_id, seq=seq, name=name)
            self._q("keep_journal_mark", workflow_id=workflow_id, seq=seq, name=name)
            self._q("drop_signal_wait", workflow_id=workflow_id, seq=seq, name=name)
        return fence.asked(now)

    def start_child(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        child: base.NewWorkflow,
        now: float,
    ) -> journal.WorkflowInfo:
        fence = self._fenced_upsert(workflow_id, epoch, entries, now)
        child = dataclasses.replace(child, parent_id=workflow_id)
        created = self._insert_workflow(
            child, None, None, now, inherited_deadline=fence.deadline_at
        )
        if (
            created is not None
            and fence.asked(now)
            and not self._cancel_delivered(workflow_id, entries)
        ):
            # The parent's cancel was committed before this start, and its cascade found no
            # child: this one is cancelled unstarted (as that cascade would have), not left
            # to run on for a cancelled parent. (Once the parent's run received its cancel,
            # a child its cleanup starts is the cleanup's: it runs.)
            stopped = cancellation.cancelled(
                child.workflow_id, "before it started", created.deadline_at, now
            )
            error = codec.encode(codec.encode_error(stopped), where="workflow error")
            self._q("cancel_unstarted", workflow_id=child.workflow_id, error=error, now=now)
        self._wake("work")
        row = self.get_workflow(child.workflow_id)
        assert row is not None
        if row.name != child.name and entries:
            # The id names another workflow: the caller raises WorkflowIdConflict. Its
            # start, the last entry, is taken back, so that a replay asks again and raises
            # again instead of finding it and going on as if the child had started.
            self._q("delete_entry", workflow_id=workflow_id, seq=entries[-1].seq)
        return row

    def _cancel_delivered(self, workflow_id: str, entries: Sequence[journal.Entry]) -> bool:
        """Whether the workflow's run has received its cancel: its marker is in the journal
        or among the entries this write journals."""
        if any(e.kind == journal.Kind.CANCEL for e in entries):
            return True
        return self._q("cancel_delivered", workflow_id=workflow_id).fetchone() is not None

    def join_child(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            return replay.join_outcome(wait, self.get_workflow(wait.name), now)

        return self._settle_wait(workflow_id, epoch, wait, entries, now, outcome)

    def list_signals(self, workflow_id: str) -> list[dict[str, Any]]:
        rows = self._q("list_signals", workflow_id=workflow_id).fetchall()
        return [dict(zip(_SIGNAL_KEYS, r, strict=True)) for r in rows]

    @marks.one_read
    def signals_page(
        self, workflow_id: str, before_num: int | None, limit: int
    ) -> list[dict[str, Any]]:
        # the newest: before the largest num a BIGINT holds, which no count of signals reaches
        num = validate.BIGINT[1] if before_num is None else before_num
        rows = self._q("signals_page", workflow_id=workflow_id, num=num, limit=limit).fetchall()
        return [dict(zip(_SIGNAL_KEYS, r, strict=True)) for r in reversed(rows)]


#: The fields of a signal as list_signals and signals_page return it, in the queries' order.
_SIGNAL_KEYS = ("num", "name", "payload", "idempotency_key", "sent_at", "consumed_seq")
