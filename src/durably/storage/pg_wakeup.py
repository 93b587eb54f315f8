"""A signal's wake-up on PostgreSQL in one round trip: the send, the claim, the receive.

An engine that sends a signal to a workflow parked on it, which it can run, takes the
workflow in the same commit (``operations.send_signal_and_claim``). Verb by verb that is
two round trips: BEGIN with the signal kept, the claim and the journal read, then the
receive of the parked wait with COMMIT, whose arguments come from that journal. Here
the server finds the wait itself (``receive_taken_signal`` in queries.sql), so BEGIN,
the four statements and COMMIT go in one pipeline of libpq's (``pg_direct``), and the
Python reads what they did instead of deciding it. A part of
:class:`~durably.storage.postgres.PostgresStore`, kept apart from its connections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from durably.storage import base, claims, pg_ahead, pg_statements, rows


class WakeupVerbs(pg_ahead.AheadBatches):
    """``send_signal_and_take`` in one round trip."""

    def send_signal_and_take(
        self,
        workflow_id: str,
        name: str,
        payload: str,
        idempotency_key: str | None,
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
        if not (session.one_op and session.begin_pending and not session.ahead):
            return None
        if not self._connected():
            return None
        if self._temp_tables().runnable != claims.runnable_rows(runnable, same_code):
            return None
        keep = self._keep_signal_params(workflow_id, name, payload, idempotency_key, now, False)
        claim = pg_statements.claim_woken_params(owner, workflow_id, lease_expires_at, now)
        take = {**claim, "name": name, "channel": self.channel, "wakeup": keep["wakeup"]}
        queries = self._queries
        direct = self._direct(self.conn)
        results = direct.transaction(
            [
                (queries["keep_signal"], keep),
                (queries["claim_woken"], claim),
                (queries["receive_taken_signal"], take),
                (queries["load_history"], {"workflow_id": workflow_id}),
            ]
        )
        if results is None:  # what psycopg must send: the verbs go one by one
            return None
        session.begin_pending = False  # BEGIN went with them, and COMMIT: all is committed
        kept_row, claimed, received, journal_rows = (direct.answer(r) for r in results)
        sent = self._signal_sent(workflow_id, name, self._kept(workflow_id, kept_row.fetchone()))
        found = claims.taken(rows.every(claimed))
        if not found:
            return base.Woken(sent)
        history = [rows.entry(r) for r in rows.every(journal_rows)]
        seq = received.fetchone()[0]
        if seq is None or not history or history[-1].seq != seq:
            return base.Woken(sent, found[0], history)  # nothing received: the run will
        return base.Woken(sent, found[0], history, history[-1])
