"""PostgreSQL batches whose first statements are sent ahead, pipelined with BEGIN.

Every statement to a server is a round trip. Where a batch's first statements are known
before its ops run (a group commit's one statement per workflow), they go with BEGIN in
one pipeline, and each op then finds its statement's answer waiting instead of sending
it. The pipeline is
libpq's (``pg_direct.Direct.begin_with``: one wait for all); where that declines, it is
psycopg's, where a query many ops of a group commit share goes as one ``executemany``
(a wait more in the pipeline, ``_send``). The plan is checked, never trusted: an op
that sends something else first rolls the batch back, and it runs as usual. A part of
:class:`~durably.storage.postgres.PostgresStore`, kept apart from its connections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from durably.storage import base, marks, pg_direct, pg_statements


class Session(pg_statements.Session, Protocol):
    """What a batch sent ahead reads and sets on the calling thread's session."""

    conn: psycopg.Connection[Any] | None
    begin_pending: bool
    #: The running op's planned statements, sent ahead of its batch, each with the cursor
    #: holding its answer, until the op sends it (``AheadBatches._run_ahead``).
    ahead: list[tuple[pg_statements.Ahead, Any]]
    #: The op's last statement and its COMMIT succeeded (``PostgresStore._end_with``).
    ended: bool
    #: The batch is one op (which may then commit all it does itself: ``pg_wakeup``).
    one_op: bool


class AheadBatches(pg_statements.OneStatementVerbs):
    """``run_batch`` with the batch's known first statements sent ahead."""

    @property
    def _session(self) -> Session:
        raise NotImplementedError

    @property
    def _conn(self) -> psycopg.Connection[Any] | None:
        """This thread's connection, if it has one."""
        return self._session.conn

    @property
    def conn(self) -> psycopg.Connection[Any]:
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError

    def _direct(self, conn: psycopg.Connection[Any]) -> pg_direct.Direct:
        raise NotImplementedError

    def run_batch(self, ops: Sequence[base.Op]) -> None:
        session = self._session
        # An op alone may promise its last verb, whose statement then goes with COMMIT.
        session.one_op = len(ops) == 1
        session.ends_with = marks.ending_verb(ops[0].fn) if session.one_op else None
        try:
            planned = self._plan_ahead(ops)
            if planned is not None and self._run_ahead(ops, planned):
                return
            super().run_batch(ops)
        finally:
            session.ends_with = None
            session.ended = False
            session.one_op = False

    def _plan_ahead(self, ops: Sequence[base.Op]) -> list[list[pg_statements.Ahead]] | None:
        """The statements to send ahead of each op of the batch, or None for none.

        A group commit: each op's first statement, where every op's is known from its
        arguments and the ops are of different workflows (``_statement_ahead``). A
        finish's statement here is ``finish_and_wake``, which wakes its parent itself: a
        parent's row is locked with the finish (in the batch's order, or with the other
        finishes: ``_send``), not after every op. One op alone sends its own first
        statement with BEGIN anyway (``PostgresStore._send_first``); a wake-up is one
        round trip of its own (``pg_wakeup``).
        """
        if len(ops) < 2 or not self._connected():
            return None
        planned: list[list[pg_statements.Ahead]] = []
        seen: set[str] = set()
        for op in ops:
            ahead = self._statement_ahead(op)
            if ahead is None or ahead[0] in seen:
                return None
            seen.add(ahead[0])
            planned.append([pg_statements.Ahead(self._queries[ahead[1]], ahead[2])])
        return planned

    def _connected(self) -> bool:
        """This thread has a live connection: what a plan reads of it (its temporary tables)
        is known. (A lost one is replaced at BEGIN, with none.)"""
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def _run_ahead(self, ops: Sequence[base.Op], planned: list[list[pg_statements.Ahead]]) -> bool:
        """Run a batch with the ``planned`` statements of each op sent ahead, pipelined
        with BEGIN: two round trips (that and COMMIT) where each statement was one more
        (and one per ``executemany``, ``_send``).

        Each op must then send its planned statements first, in order; its later
        statements (rare in a group commit: entries after the first, an error's details)
        follow in the same transaction. False, with nothing left done, where a verb sent
        another statement before a planned one, or left one unsent: the batch then runs
        as usual. An op that fails undoes all, as in ``SqlBase.run_batch``, and the batch
        runs again guarded.
        """
        if not self._begin_batch(ops):
            return True  # every op failed with why
        session = self._session
        session.begin_pending = False  # sent here, with the statements
        conn = self.conn
        try:
            sent = _send_direct(self._direct(conn), planned)
            if sent is None:  # what psycopg must send (pg_direct.Direct.begin_with)
                with conn.pipeline():
                    conn.execute("BEGIN")
                    answers = _send(conn, planned)
                sent = answers()
        except Exception:  # a lost connection, a value refused: as usual, from the start
            self._undo(ops)  # (psycopg may have sent BEGIN and some before it raised)
            return False
        try:
            for op, ahead in zip(ops, sent, strict=True):
                session.ahead = ahead
                op.result = op.fn(*op.args)
                if session.ahead:
                    raise Unplanned  # a statement the op did not send: not what was planned
        except Unplanned:
            self._undo(ops)
            return False
        except Exception:
            self._undo(ops)
            if self._begin_batch(ops):
                self._run_guarded(ops)
            return True
        finally:
            session.ahead = []
        self._finish(ops)
        return True

    def _sent_ahead(self, sql_text: str, params: Mapping[str, Any] | None) -> Any:
        """The cursor of this statement if it was sent ahead (``_run_ahead``), else None.

        Raises Unplanned where the op sends another statement before a planned one.
        """
        ahead = self._session.ahead
        if not ahead:
            return None
        planned, cursor = ahead.pop(0)
        if sql_text is planned.sql_text and params == planned.params:
            return cursor
        raise Unplanned

    def _undo(self, ops: Sequence[base.Op]) -> None:
        """Roll the batch's transaction back (a broken connection is dropped: the next
        batch connects again) and forget what its ops answered."""
        self._session.ahead = []
        conn = self._conn
        if conn is not None and conn.broken:
            self._drop()
        self._rollback()
        for op in ops:
            op.result = None


def _send_direct(
    direct: pg_direct.Direct, planned: list[list[pg_statements.Ahead]]
) -> list[list[tuple[pg_statements.Ahead, Any]]] | None:
    """BEGIN and every op's planned statements through libpq's pipeline (``pg_direct``),
    each op given its statements with their answers; None where psycopg must send them.
    Each statement is bound on its own, as the ops will read them."""
    flat = [(a.sql_text, a.params) for statements in planned for a in statements]
    answers = direct.begin_with(flat)
    if answers is None:
        return None
    given = iter(answers)
    return [[(a, next(given)) for a in statements] for statements in planned]


#: The fewest ops of one query a group commit sends as one ``executemany`` (``_send``):
#: psycopg waits for its answers before it returns, a round trip more for the batch,
#: which the client time it saves pays for only in a large group (ninth pass of issue 12).
MANY_AT_LEAST = 8


def _send(
    conn: psycopg.Connection[Any], planned: list[list[pg_statements.Ahead]]
) -> Callable[[], list[list[tuple[pg_statements.Ahead, Any]]]]:
    """Send each op's planned statements into the open pipeline; returns what gives each
    op its statements with their answers once the pipeline has synced.

    A group commit plans one statement per op, most of them the same query (a step's
    commit, a start, a finish). The statements of a query that ``MANY_AT_LEAST`` ops or
    more share go last, as one ``executemany``, which psycopg converts once and binds
    for each op: about half its client time a statement, for a round trip more (it
    waits for the answers). Each op's answer is then read off into a
    :class:`~durably.storage.pg_direct.Answer`. The others go one by one, in the batch's
    order.
    """
    groups: dict[str, list[int]] = {}
    if all(len(statements) == 1 for statements in planned):  # a group commit's plan
        for i, (ahead,) in enumerate(planned):
            groups.setdefault(ahead.sql_text, []).append(i)
    many = [members for members in groups.values() if len(members) >= MANY_AT_LEAST]
    together = {i for members in many for i in members}
    answered: list[list[tuple[pg_statements.Ahead, Any]]] = [
        [] if i in together else [(a, conn.execute(a.sql_text, a.params)) for a in statements]
        for i, statements in enumerate(planned)
    ]
    cursors: list[tuple[Any, list[int]]] = []
    for members in many:
        cursor = conn.cursor()
        params = [planned[i][0].params for i in members]
        cursor.executemany(planned[members[0]][0].sql_text, params, returning=True)
        cursors.append((cursor, members))

    def answers() -> list[list[tuple[pg_statements.Ahead, Any]]]:
        # (called once, after the pipeline: fills in the grouped ops' places)
        for cursor, members in cursors:
            for n, i in enumerate(members):
                if n and not cursor.nextset():
                    raise psycopg.InterfaceError("executemany answered fewer statements")
                result = cursor.pgresult  # (not ``description``: an object a column each call)
                rows = cursor.fetchall() if result is not None and result.nfields else []
                answered[i] = [(planned[i][0], pg_direct.Answer(rows, cursor.rowcount, result))]
        return answered

    return answers


class Unplanned(BaseException):
    """A verb's first statement was not the one sent ahead of its batch (``_run_ahead``):
    the batch is rolled back and runs as usual. A BaseException, so that no verb's
    ``except Exception`` takes it for its own error."""
