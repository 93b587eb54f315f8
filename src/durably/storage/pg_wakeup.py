"""A workflow's wake-up on PostgreSQL in one round trip: the signal, the claim, the receive.

An engine that sends a signal to a workflow parked on it, which it can run, takes the
workflow in the same commit (``operations.send_signal_and_claim``); an engine told of a
signal sent elsewhere claims the workflow by id (``operations.take_woken``). Verb by
verb each is two round trips: BEGIN with the signal kept, the claim and the journal
read, then the receive of the parked wait with COMMIT, whose arguments come from that
journal. Here the server finds the wait itself (``receive_taken_signal`` in
queries.sql), so BEGIN, the statements and COMMIT go in one pipeline of libpq's
(``pg_direct``), and the Python reads what they did instead of deciding it. A signal
and its claim are one statement (``keep_and_claim_signal``), which writes the
workflow's row once. A part of :class:`~durably.storage.postgres.PostgresStore`, kept
apart from its connections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from durably import journal
from durably.storage import base, claims, pg_ahead, pg_statements, rows


class WakeupVerbs(pg_ahead.AheadBatches):
    """``take_at_once`` in one round trip."""

    def take_at_once(
        self,
        workflow_id: str,
        signal: tuple[str, str, str | None] | None,
        now: float,
        owner: str,
        runnable: Sequence[base.Runnable],
        lease_expires_at: float,
        same_code: Mapping[str, str] | None,
    ) -> base.Woken | None:
        # Only as the whole of a batch's one op, before it sent anything: its COMMIT is
        # the batch's. And only on a connection whose runnable_here holds this claim's
        # set (the claim is then one statement): else the verbs go one by one, and the
        # claim writes it for the next time.
        session = self._session
        if not (session.one_op and session.begin_pending):
            return None
        if not self._connected():
            return None
        if self._temp_tables().runnable != claims.runnable_rows(runnable, same_code):
            return None
        claim = pg_statements.claim_woken_params(owner, workflow_id, lease_expires_at, now)
        queries = self._queries
        told = {"channel": self.channel, "wakeup": ""}  # no signal kept here: no one told
        take = (queries["claim_woken"], claim)
        if signal is not None:  # kept and claimed in one statement (keep_and_claim_signal)
            name, payload, key = signal
            keep = self._keep_signal_params(workflow_id, name, payload, key, now, False)
            told = {"channel": self.channel, "wakeup": keep.pop("wakeup")}
            del keep["channel"], keep["tell"]
            take = (queries["keep_and_claim_signal"], {**claim, **keep})
        direct = self._direct(self.conn)
        if direct.lost():  # closed by the server while idle: the verbs connect again
            return None
        results = direct.transaction(
            [
                take,
                (queries["receive_taken_signal"], {**claim, **told}),
                (queries["load_history"], {"workflow_id": workflow_id}),
            ]
        )
        if results is None:  # what psycopg must send: the verbs go one by one
            return None
        session.begin_pending = False  # BEGIN went with them, and COMMIT: all is committed
        session.ended = True  # an answer that fails to load fails after the commit
        claimed, received, journal_rows = [direct.answer(r) for r in results]
        if signal is None:
            found = claims.taken(rows.every(claimed))
        else:
            kept, found = _kept_and_taken(claimed)
        history = [rows.entry(r) for r in rows.every(journal_rows)] if found else []
        seq = received.fetchone()[0]
        # What follows raises only where nothing was written: a send refused as unknown or
        # finished claims nothing (keep_and_claim_signal), so it received nothing either.
        session.ended = False
        sent = True
        if signal is not None:  # (raises where the workflow is unknown or has ended)
            sent = self._signal_sent(workflow_id, signal[0], self._kept(workflow_id, kept))
        if not found:
            return base.Woken(sent)
        if seq is None or not history or history[-1].seq != seq:
            return base.Woken(sent, found[0], history)  # nothing received: the run will
        return base.Woken(sent, found[0], history, history[-1])


#: The columns of ``keep_and_claim_signal`` that say what its signal did (``_kept``'s row).
_KEPT_COLUMNS = 4


def _kept_and_taken(answer: Any) -> tuple[Any, list[journal.WorkflowInfo]]:
    """``keep_and_claim_signal``'s one row split: what the signal did (None: no row, no
    such workflow) and the workflow it took, if it took one."""
    row = answer.fetchone()
    if row is None:
        return None, []
    kept, taken = row[:_KEPT_COLUMNS], row[_KEPT_COLUMNS:]
    if taken[0] is None:  # the workflow_id of a row not taken
        return kept, []
    columns = rows.names(answer)[_KEPT_COLUMNS:]
    return kept, [rows.workflow(dict(zip(columns, taken, strict=True)))]
