"""PostgreSQL's verbs in one statement each: a round trip each, where SQL sends several.

The generic verbs (:mod:`durably.storage.sql`) send one statement at a time; with a
server each is a round trip. Here the dialect overrides the hooks where
PostgreSQL's data-modifying ``WITH`` does a verb's work at once (the statements are
in queries.sql, marked "PostgreSQL only"), and sends a statement that is all its
batch writes without BEGIN and COMMIT (``_alone``). A part of
:class:`~durably.storage.postgres.PostgresStore`, kept apart from its connections.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from durably import journal, replay
from durably.storage import base, claims, entries, rows, signals, sql, sqlbase

#: The payload of a ``work`` wake-up (a free place in a queue), encoded once.
_WORK = sqlbase.encode_wakeup(base.Wakeup("work"))


@dataclasses.dataclass(frozen=True, slots=True)
class Ahead:
    """A statement an op of a group commit is planned to send first, to be sent ahead of
    it (``OneStatementVerbs._statement_ahead``, ``pg_ahead``)."""

    sql_text: str
    params: dict[str, Any]


def claim_woken_params(
    owner: str, workflow_id: str, lease_expires_at: float, now: float
) -> dict[str, Any]:
    """The parameters of ``claim_woken`` (``_claim_woken``, ``pg_wakeup``)."""
    return {"owner": owner, "workflow_id": workflow_id, "lease_expires_at": lease_expires_at,
            "now": now}  # fmt: skip


#: The entries module's names a verb whose ``entries`` argument hides the module uses.
_entry_params, _Fence = entries.entry_params, entries.Fence


class Session(Protocol):
    """What ``_alone`` reads and sets on the calling thread's session."""

    solo: bool
    skip_begin: bool
    ahead: Any  # the op's statements sent ahead of its batch (pg_ahead.AheadBatches._run_ahead)
    #: The verb the batch's one op promises to call last (``marks.ending_verb``), if any.
    ends_with: str | None
    #: The next statement is the op's last: it goes with COMMIT (``_ending``).
    commit_with: bool


class OneStatementVerbs(sql.SqlStore):
    """The hooks of :class:`~durably.storage.sql.SqlStore` PostgreSQL does in one statement."""

    @property
    def _session(self) -> Session:
        raise NotImplementedError

    @contextlib.contextmanager
    def _alone(self, whole: bool) -> Iterator[None]:
        """Around a verb's first statement: when it is ``whole`` (all the verb writes) and
        the verb is alone in its batch, it is sent without BEGIN (and so needs no COMMIT):
        a statement on its own is a transaction, and the batch one round trip."""
        session = self._session
        session.skip_begin = whole and session.solo
        try:
            yield
        finally:
            session.skip_begin = False

    @contextlib.contextmanager
    def _ending(self, verb: str) -> Iterator[None]:
        """Around the one statement of ``verb``, where the batch's one op promised to call
        it last (``marks.ends_with``): the statement is sent with COMMIT,
        pipelined, and the transaction ends with it: a round trip less. If it fails, the
        COMMIT is not applied and the batch is rolled back as usual."""
        session = self._session
        session.commit_with = session.ends_with == verb
        try:
            yield
        finally:
            session.commit_with = False

    def _create_row(
        self,
        new: base.NewWorkflow,
        owner: str | None,
        lease_expires_at: float | None,
        now: float,
        *,
        whole: bool,
    ) -> journal.WorkflowInfo | None:
        if not owner:
            return super()._create_row(new, owner, lease_expires_at, now, whole=whole)
        with self._alone(whole):  # the row and its claim: one statement
            return self._insert_workflow(
                new, owner, lease_expires_at, now, query="create_owned_workflow"
            )

    def _statement_ahead(self, op: base.Op) -> tuple[str, str, dict[str, Any]] | None:
        """The first statement ``op`` sends in a batch of several, told from its arguments
        alone: (the workflow it writes, the query's name, its parameters); None for a verb
        whose first statement depends on what it reads. PostgresStore sends these ahead
        of a batch, and each verb must then send exactly that statement first."""
        if getattr(op.fn, "__self__", None) is not self:
            return None
        verb = op.fn.__name__
        if verb == "append_entries":  # a step's commit: _fenced_upsert's first write
            workflow_id, epoch, written, now = op.args
            if not written:
                return None
            params = entries.entry_params(workflow_id, written[0])
            return workflow_id, "fence_and_write_entry", {"now": now, "epoch": epoch, **params}
        if verb == "finish_workflow":  # the usual end: _finish_at_once's one statement
            workflow_id, epoch, status, output, error, written, now = op.args
            if written:
                return None
            return (
                workflow_id,
                "finish_and_wake",
                self._finish_and_wake_params(
                    status, error, output=output, now=now, workflow_id=workflow_id, epoch=epoch
                ),
            )
        if verb == "create_workflow":  # a start here: the row and its claim
            new, owner, lease_expires_at, now = op.args
            # (a deduplicated one may read what another op of the batch ends)
            if not owner or new.debounce_key is not None or new.deduplication_id is not None:
                return None
            params = claims.workflow_params(new, owner, lease_expires_at, now)
            return new.workflow_id, "create_owned_workflow", params
        return None

    def _claim_and_record(self, **params: Any) -> journal.WorkflowInfo | None:
        # One statement (a data-modifying WITH), not three: the claim, its record, the row.
        found = rows.first(self._q("claim_and_record", **params))
        return rows.workflow(found) if found else None

    def _claim_unqueued(
        self, owner: str, lease_expires_at: float, now: float, limit: int
    ) -> list[journal.WorkflowInfo]:
        # The pick and every claim of it in one statement: a pass is BEGIN with it, COMMIT.
        params = {"owner": owner, "lease_expires_at": lease_expires_at, "now": now}
        return claims.taken(rows.every(self._q("claim_unqueued", limit=limit, **params)))

    def _claim_woken(
        self, owner: str, workflow_id: str, lease_expires_at: float, now: float
    ) -> journal.WorkflowInfo | None:
        # The pick and its claim in one statement, as _claim_unqueued's.
        params = claim_woken_params(owner, workflow_id, lease_expires_at, now)
        found = claims.taken(rows.every(self._q("claim_woken", **params)))
        return found[0] if found else None

    def _fence_and_write(
        self, workflow_id: str, epoch: int, entry: journal.Entry, now: float, *, whole: bool
    ) -> tuple[entries.Fence, int | None]:
        # One statement, so one round trip: the fence's SELECT ... FOR UPDATE and the upsert
        # of the first entry, written only if the fence held. When it is all of a batch
        # (one op, which writes nothing else), it is sent without BEGIN and COMMIT: a
        # single statement is a transaction of its own, so the whole commit is that one
        # round trip, and _commit finds nothing left to commit.
        with self._alone(whole):
            params = entries.entry_params(workflow_id, entry)
            found = self._q("fence_and_write_entry", now=now, epoch=epoch, **params).fetchone()
        if found is None:  # the fence did not hold: nothing was written
            raise self._fenced_off(workflow_id, epoch)
        cancel_requested, crash_count, deadline_at, written = found
        if written and entry.status in journal.FINAL_ENTRY_STATUSES:
            crash_count = 0  # the statement reset the crashes counted (``progressed``)
        fence = entries.Fence(
            workflow_id, epoch, bool(cancel_requested), int(crash_count), deadline_at
        )
        return fence, int(written)

    def _publish_event(self, workflow_id: str, key: str, value: str, seq: int, now: float) -> None:
        # One statement (publish_event_and_wake): the event, its parked readers made due,
        # and the notifications, where the generic verb sends three (and a fourth, when a
        # reader was woken).
        event = sqlbase.encode_wakeup(base.Wakeup("event", workflow_id, name=key))
        self._q(
            "publish_event_and_wake",
            workflow_id=workflow_id, key=key, value=value, seq=seq, now=now,
            label=f"{key} of {workflow_id}", channel=self.channel, event=event, work=_WORK,
        )  # fmt: skip

    def _finish_at_once(self, status: str, error: str | None, **params: Any) -> Any:
        # One statement (finish_and_wake): the fenced finish, its parent's wake-up and the
        # notifications. When it is all of a batch it is sent without BEGIN and COMMIT, so
        # a plain finish is one round trip, not two; if its fence did not hold, it wrote
        # nothing, and what the verb writes next begins a transaction again.
        session = self._session
        if not session.solo and not session.ahead:  # a batch's: no round trip to save
            return super()._finish_at_once(status, error, **params)
        with self._alone(True):
            found = self._q(
                "finish_and_wake", **self._finish_and_wake_params(status, error, **params)
            ).fetchone()
        if found is not None:
            return None, None  # nothing left to wake
        self._begin_again()
        return None

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
        # Two verbs' statements in one transaction: the finish is never the one statement
        # sent alone (_finish_at_once), which would commit the end before the reviews close.
        session = self._session
        solo, session.solo = session.solo, False
        try:
            return super().finish_closing_reviews(
                workflow_id, epoch, status, output, error, entries, now
            )
        finally:
            session.solo = solo

    def _finish_and_wake_params(
        self, status: str, error: str | None, **params: Any
    ) -> dict[str, Any]:
        """The parameters of ``finish_and_wake`` (``_finish_at_once``, ``_statement_ahead``)."""
        return {"status": status, "error": error, "fenced": 1, "channel": self.channel,
                "work": _WORK, **params}  # fmt: skip

    def _begin_again(self) -> None:
        """After a statement sent alone (a transaction of its own), send BEGIN with the next."""
        raise NotImplementedError

    def receive_signal(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        # With no entries to write first, one statement (fence_and_receive_signal): the
        # fence and, when a signal is there, the whole receive; sent alone when the verb is
        # its batch, so a run that finds its signal there receives it in one round trip.
        # When it wrote nothing, what follows writes under a fence of its own: sent alone,
        # the statement's row lock ended with it.
        if entries:
            return super().receive_signal(workflow_id, epoch, wait, entries, now)
        with self._alone(True):
            params = _entry_params(workflow_id, wait)
            row = self._q("fence_and_receive_signal", now=now, epoch=epoch, **params).fetchone()
        if row is None:
            raise self._fenced_off(workflow_id, epoch)
        cancel_requested, crash_count, deadline_at, final, num, payload, written = row
        if written:  # received: the entry is what signal_outcome makes of the signal
            return replay.signal_outcome(wait, str(payload), now)
        self._begin_again()  # what follows is a transaction of its own
        if final:  # rare: an earlier commit's outcome was not known to its caller
            settled = self._final_at(workflow_id, wait.seq)
            if settled is not None:  # (a final entry is never changed)
                return settled
        outcome = replay.signal_outcome(wait, None if num is None else str(payload), now)
        if num is not None:  # another call's entry holds the wait's seq: refused as _wrote does
            fence = _Fence(
                workflow_id, epoch, bool(cancel_requested), int(crash_count), deadline_at
            )
            self._wrote(workflow_id, outcome, 0, now, fence)  # raises: it is not final
            return outcome
        self._fenced_upsert(workflow_id, epoch, [outcome], now, last=True)
        return outcome

    def receive_parked_signal(
        self, workflow_id: str, epoch: int, wait: journal.Entry, now: float
    ) -> journal.Entry:
        # One statement and nothing after it, whatever it finds, so that it can be the
        # op's last and go with COMMIT (``_ending``): where it received nothing (no signal
        # yet, or a fence or an entry not as the claim left them, which the claim in the
        # same transaction rules out) the wait is returned as it is and the run receives
        # it at its wait, as receive_signal's later statements would have here.
        with self._alone(True), self._ending("receive_parked_signal"):
            params = _entry_params(workflow_id, wait)
            row = self._q("fence_and_receive_signal", now=now, epoch=epoch, **params).fetchone()
        if row is None or not row[-1]:
            return wait
        return replay.signal_outcome(wait, str(row[5]), now)

    def _fence_and_look(
        self, workflow_id: str, epoch: int, wait: journal.Entry, now: float
    ) -> tuple[entries.Fence, journal.Entry | None, tuple[int, str] | None]:
        # One statement: the fence, the wait's final entry (whether there is one) and the
        # signal it receives (fence_and_next_signal in queries.sql).
        found = self._q(
            "fence_and_next_signal",
            workflow_id=workflow_id,
            epoch=epoch,
            seq=wait.seq,
            name=wait.name,
        ).fetchone()
        if found is None:
            raise self._fenced_off(workflow_id, epoch)
        cancel_requested, crash_count, deadline_at, final, num, payload = found
        fence = entries.Fence(
            workflow_id, epoch, bool(cancel_requested), int(crash_count), deadline_at
        )
        if final:  # rare: an earlier commit's outcome was not known to its caller
            return fence, self._final_at(workflow_id, wait.seq), None
        return fence, None, None if num is None else (int(num), str(payload))

    def _consume_and_write(
        self,
        workflow_id: str,
        num: int | None,
        final: journal.Entry,
        now: float,
        fence: entries.Fence,
    ) -> None:
        if num is None:
            super()._consume_and_write(workflow_id, num, final, now, fence)
            return
        params = entries.entry_params(workflow_id, final)
        cursor = self._q("consume_and_write_entry", num=num, **params)
        self._wrote(workflow_id, final, cursor.rowcount, now, fence)

    def _keep_signal_params(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
        now: float,
        tell: bool,
    ) -> dict[str, Any]:
        """The parameters of ``keep_signal`` (``_keep_signal``, ``pg_wakeup``)."""
        wakeup = sqlbase.encode_wakeup(base.Wakeup("signal", workflow_id, name))
        return {"workflow_id": workflow_id, "name": name, "payload": payload,
                "idempotency_key": idempotency_key, "now": now, "channel": self.channel,
                "wakeup": wakeup, "tell": tell}  # fmt: skip

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
    ) -> signals.KeptSignal:
        # One statement (keep_signal in queries.sql); alone in its batch, one round trip.
        # Only with a key: a statement sent alone commits as it runs, and one whose answer
        # a lost connection took is sent again on a new one (PostgresStore._execute); with
        # its key it finds its own signal then, without one it would keep a second. Keyless,
        # it goes with BEGIN, and a loss before its COMMIT leaves nothing committed.
        params = self._keep_signal_params(workflow_id, name, payload, idempotency_key, now, tell)
        with self._alone(whole and idempotency_key is not None):
            found = self._q("keep_signal", **params).fetchone()
        return self._kept(workflow_id, found)

    def _kept(self, workflow_id: str, found: Any) -> signals.KeptSignal:
        """What ``keep_signal``'s row (``found``, None: no row) says was done."""
        if found is None:
            return signals.KeptSignal(None)
        status, duplicate, counted, kept = str(found[0]), bool(found[1]), found[2], found[3]
        if duplicate or (counted and not kept):  # the key's first sender got there first
            return signals.KeptSignal(status, duplicate=True)
        if not counted:  # it has ended, maybe since the statement's snapshot
            row = self.get_workflow(workflow_id)
            return signals.KeptSignal(status if row is None else row.status, finished=True)
        return signals.KeptSignal(status, kept=True)
