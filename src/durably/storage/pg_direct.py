"""Statements sent straight through libpq, without psycopg's cursor around them.

A statement through ``Connection.execute`` costs this process 60-80 µs of CPU on the
development VM, for a one-row ``INSERT``; the same prepared statement sent through the
connection's libpq object (``pgconn``) costs about 30 (issue 12, seventeenth pass).
The rest is psycopg's cursor: a new one a statement, its query conversion, its
prepared-statement manager and its generators, all in Python. A plain step's commit, a
start and a finish are each one statement alone, a group commit BEGIN with one
statement a workflow, and a signal's wake-up one pipeline: the difference is a tenth
of a step and more than a tenth of a 1-step workflow's client time.

:class:`Direct` sends the store's statements itself and keeps what psycopg would do
with them: the parameters are dumped and the rows loaded by psycopg's own
``Transformer`` (the same types both ways, JSON included), the errors are psycopg's
(``error_from_result``, the same SQLSTATE classes ``PostgresStore._map_error`` reads)
and the wait is psycopg's (``Connection.wait``, which releases the GIL and cancels the
query on an interrupt). Each statement is prepared at its first use on the connection,
under a name of its own (``durably_N``, never reused).

The store's connections never let psycopg prepare (``prepare_threshold=None``, what
``Direct`` declines goes unprepared): psycopg sends ``DEALLOCATE ALL`` after a
``ROLLBACK``, a ``DROP`` or an ``ALTER`` only when it has names of its own, and that
would take ours too (eighteenth pass). Only a ``DEALLOCATE`` or ``DISCARD ALL`` sent by
something else can still take them; the server then refuses such a name at ``Bind``.
What can simply be sent again is, from an idle connection: a statement that is a
transaction of its own (refused, nothing ran), and BEGIN with a batch's first
statements in one pipeline (refused, what the pipeline began is rolled back). A
statement refused later in a transaction fails it, as any error there does, and the
next one is prepared again. A composed query and a value psycopg cannot dump go
through psycopg.

A connection keeps at most ``PREPARED_MAX`` names. At one more, from an idle
connection, the least recently used eighth is deallocated (one round trip, rare): a
migration's statements, run once, and a text's rare mixes of parameter types age out
instead of holding their slots for the connection's life. Inside a transaction a
``DEALLOCATE`` that failed would abort it, so there a new statement past the limit
goes through psycopg, unprepared, until the next batch makes room.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer

#: How many statements one connection keeps prepared here: more than the queries a
#: process runs often (about 110, and a few texts each for the statements that list ids
#: or compose a search's filters). Past that, the least recently used are deallocated.
PREPARED_MAX = 256

# A psycopg-style parameter ("%(name)s") or an escaped "%" (``postgres._paramstyle``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")

_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_PIPELINE_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_OK = pq.ConnStatus.OK
_PIPELINE_OFF = pq.PipelineStatus.OFF
_IDLE = pq.TransactionStatus.IDLE
_INTRANS = pq.TransactionStatus.INTRANS
_AUTO = PyFormat.AUTO


def positional(sql_text: str) -> tuple[bytes, tuple[str, ...]]:
    """The statement in PostgreSQL's own parameters (``$1``...), and the name of each.

    A name used twice is one parameter, as psycopg sends it.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PLACEHOLDER.sub(number, sql_text).encode(), tuple(names)


class Answer:
    """What a verb reads of a cursor: its rows, ``rowcount``, and ``pgresult`` for the
    column names (:func:`durably.storage.rows.names`)."""

    __slots__ = ("_next", "_rows", "pgresult", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int, pgresult: Any) -> None:
        self._rows, self.rowcount, self.pgresult = rows, rowcount, pgresult
        self._next = 0

    @property
    def description(self) -> list[tuple[str]] | None:
        """The columns' names as a cursor's description gives them (None: no columns)."""
        result = self.pgresult
        if result is None or not result.nfields:
            return None
        return [(bytes(result.fname(i) or b"").decode(),) for i in range(result.nfields)]

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        found, self._rows, self._next = self._rows[self._next :], [], 0
        return found

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class Direct:
    """Statements of one connection sent through its libpq object (one thread at a time,
    as the connection is used)."""

    __slots__ = ("_encoding", "_made", "_pgconn", "_prepared", "_texts", "_tx", "conn")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._pgconn = conn.pgconn
        self._tx = Transformer(conn)
        self._encoding = conn.info.encoding
        #: (statement, parameter types) -> its prepared name on this connection.
        self._prepared: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self._made = 0  # how many names were made: the next one's number
        self._texts: dict[str, tuple[bytes, tuple[str, ...]]] = {}

    def execute(self, sql_text: Any, params: Mapping[str, Any] | None) -> Any:
        """Run one statement, alone (a transaction of its own) or in the open transaction;
        an :class:`Answer`, or psycopg's cursor where psycopg must send it."""
        status = self._status()
        bound = None if status is None else self._bind(sql_text, params)
        if status is None or bound is None or not self._room_for([bound], status):
            return self.conn.execute(sql_text, params)
        try:
            return self.answer(self._result(self._sending(bound)))
        except pg_errors.InvalidSqlStatementName:  # deallocated by another: nothing ran
            self._prepared.clear()  # (DEALLOCATE ALL or DISCARD ALL takes all of them)
            if status != _IDLE:
                raise  # the transaction is aborted: it fails as on any error
            return self.answer(self._result(self._sending(bound)))

    def end_with(self, sql_text: Any, params: Mapping[str, Any] | None) -> Any:
        """The open transaction's last statement and COMMIT in one pipeline, one round
        trip: its result, for ``answer`` (called once the caller has noted the commit, as
        loading its rows may fail). None, having sent nothing, where psycopg must send
        it. Either failing raises its error, and nothing of the transaction is committed."""
        if self._status() != _INTRANS:
            return None
        bound = self._bind(sql_text, params)
        if bound is None or not self._room_for([bound], _INTRANS):
            return None
        try:
            return self._pipeline([bound], begin=False, commit=True)[0]
        except pg_errors.InvalidSqlStatementName:
            self._prepared.clear()
            raise

    def commit(self) -> None:
        """COMMIT the open transaction (its error raised, as psycopg raises it)."""
        self._result(_sent(self._pgconn, self._pgconn.send_query, b"COMMIT"))

    def begin_with(self, statements: Sequence[tuple[Any, Any]]) -> list[Answer] | None:
        """BEGIN and ``statements`` (each ``(sql_text, params)``) in one pipeline, one round
        trip: each statement's :class:`Answer`, the transaction left open. None, having
        sent nothing, where psycopg must send them (as for ``execute``).

        A name psycopg deallocated is refused at its ``Bind``, which aborts the
        transaction: what ran before it in the pipeline is rolled back with it (nothing
        of it was committed), and all is sent once more, prepared again. Another error
        is raised with the transaction left aborted, as psycopg leaves it.
        """
        results = self._begun(statements, commit=False)
        return None if results is None else [self.answer(result) for result in results]

    def transaction(self, statements: Sequence[tuple[Any, Any]]) -> list[Any] | None:
        """BEGIN, ``statements`` and COMMIT in one pipeline, one round trip: each
        statement's result, for ``answer`` (committed by then). None, having sent nothing,
        where psycopg must send them. A refused name as for ``begin_with``; another error
        is raised with nothing committed and the transaction left aborted."""
        return self._begun(statements, commit=True)

    def _begun(self, statements: Sequence[tuple[Any, Any]], commit: bool) -> list[Any] | None:
        """``begin_with``'s pipeline, with COMMIT too if ``commit``: the raw results."""
        if self._status() != _IDLE:
            return None
        bound = self._bind_all(statements)
        if bound is None:
            return None
        try:
            return self._pipeline(bound, begin=True, commit=commit)
        except pg_errors.InvalidSqlStatementName:  # refused at its Bind: nothing committed
            self._result(_sent(self._pgconn, self._pgconn.send_query, b"ROLLBACK"))
            self._prepared.clear()
            return self._pipeline(bound, begin=True, commit=commit)

    def lost(self) -> bool:
        """Whether the server closed the connection while it was idle (a restart, an
        idle timeout): what it sent then is read here without waiting. Nothing sent on
        such a connection would have run, so a caller may send it on a new one instead;
        one that fails once sent may have committed."""
        pgconn = self._pgconn
        try:
            for _ in range(2):  # the server's last message, then the end of the stream
                pgconn.consume_input()
        except psycopg.OperationalError:
            return True
        return pgconn.status != _OK

    def _bind_all(self, statements: Sequence[tuple[Any, Any]]) -> list[_Bound] | None:
        """Each statement bound, from an idle connection, room made for those not yet
        prepared; None where psycopg must send one of them."""
        bound = []
        for sql_text, params in statements:
            one = self._bind(sql_text, params)
            if one is None:
                return None
            bound.append(one)
        return bound if self._room_for(bound, _IDLE) else None

    def _status(self) -> int | None:
        """The connection's transaction status where a statement may be sent here: idle,
        or in a transaction that has not failed; else None (psycopg then sends it, and
        says why it cannot)."""
        pgconn = self._pgconn
        status = pgconn.transaction_status
        if pgconn.pipeline_status != _PIPELINE_OFF or status not in (_IDLE, _INTRANS):
            return None
        return status

    def _bind(self, sql_text: Any, params: Any) -> _Bound | None:
        """The statement converted and its parameters dumped; None where psycopg must send
        it (a composed query, parameters not in a dict, one missing or one it cannot
        dump: its cursor then says so, as it always did)."""
        if type(sql_text) is not str or not (params is None or type(params) is dict):
            return None
        if params is None and "%" in sql_text:
            return None  # psycopg sends such a text as it is, "%%" included
        converted = self._texts.get(sql_text)
        if converted is None:
            converted = self._texts[sql_text] = positional(sql_text)
        query, names = converted
        if names and (params is None or not params.keys() >= set(names)):
            return None  # psycopg names what is missing
        tx = self._tx
        values = [params[name] for name in names] if params else []
        try:
            dumped = tx.dump_sequence(values, [_AUTO] * len(values))
        except Exception:  # a value psycopg cannot send: its cursor raises, as it always did
            return None
        types = tx.types or ()
        return _Bound((sql_text, types), query, types, dumped, tx.formats)

    def _room_for(self, bound: Sequence[_Bound], status: int) -> bool:
        """Whether the statements not yet prepared fit under ``PREPARED_MAX``, once the
        least recently used are deallocated where the connection is idle (``status``)."""
        prepared = self._prepared
        new = {b.key for b in bound if b.key not in prepared}
        if len(prepared) + len(new) <= PREPARED_MAX:
            return True
        if status != _IDLE or not new or len(new) > PREPARED_MAX:
            return False  # (nothing new past the limit: only where it was lowered)
        keep = {b.key for b in bound}
        over = len(prepared) + len(new) - PREPARED_MAX
        count = max(over, PREPARED_MAX // 8)
        old = [key for key in prepared if key not in keep][:count]
        names = [prepared.pop(key) for key in old]
        deallocate = b"; ".join(b"DEALLOCATE " + name for name in names)
        try:
            if deallocate:  # (none where the batch's own fill the limit)
                self._result(_sent(self._pgconn, self._pgconn.send_query, deallocate))
        except pg_errors.InvalidSqlStatementName:  # deallocated by another: all of them
            prepared.clear()
        return len(prepared) + len(new) <= PREPARED_MAX

    def _used(self, key: tuple[str, tuple[int, ...]]) -> bytes | None:
        """The name ``key`` is prepared under, if it is, made the most recently used (the
        last ``_room_for`` deallocates)."""
        name = self._prepared.pop(key, None)
        if name is not None:
            self._prepared[key] = name
        return name

    def _new_name(self) -> bytes:
        name = b"durably_%d" % self._made
        self._made += 1
        return name

    def _sending(self, bound: _Bound) -> Any:
        """What sends ``bound`` alone (prepared first if it is not yet), for ``_result``."""
        pgconn = self._pgconn
        name = self._used(bound.key)
        if name is None:
            name = self._new_name()
            self._result(
                _sent(pgconn, pgconn.send_prepare, name, bound.query, param_types=bound.types)
            )
            self._prepared[bound.key] = name
        return _sent(
            pgconn, pgconn.send_query_prepared, name, bound.dumped, param_formats=bound.formats
        )

    def _pipeline(self, bound: Sequence[_Bound], begin: bool, commit: bool) -> list[Any]:
        """``bound`` in libpq's pipeline mode, after BEGIN if ``begin`` and before COMMIT if
        ``commit``, each prepared first if it is not yet (in the same pipeline); their
        results (for ``answer``), or the first error raised, COMMIT's included.

        Sent inside ``Connection.wait`` (an interrupt there cancels and reads every
        answer). A pipeline left with answers unread (an interrupt while it was being
        sent) cannot be trusted: the connection is closed, so the store sees it broken
        and connects again, instead of reading those answers as another statement's.
        """
        pgconn = self._pgconn
        slots: list[Any] = [None] if begin else []  # each answer's: BEGIN, a name, a place
        naming: dict[tuple[str, tuple[int, ...]], bytes] = {}
        commands: list[tuple[bool, bytes, Any, Any]] = []  # (prepare?, name, what, how)
        for place, one in enumerate(bound):
            name = self._used(one.key) or naming.get(one.key)
            if name is None:
                name = naming[one.key] = self._new_name()
                commands.append((True, name, one.query, one.types))
                slots.append(one.key)
            commands.append((False, name, one.dumped, one.formats))
            slots.append(place)
        if commit:
            slots.append(None)
        try:
            results = self.conn.wait(_pipelined(pgconn, commands, len(slots), begin, commit))
        finally:
            if pgconn.pipeline_status != _PIPELINE_OFF:
                _leave_pipeline(pgconn)
        error: Exception | None = None
        answers: list[Any] = []
        for slot, answered in zip(slots, results, strict=False):
            result = answered[-1]
            status = result.status
            if status in (_COMMAND_OK, _TUPLES_OK):
                if type(slot) is tuple:  # prepared, whatever happens to the transaction
                    self._prepared[slot] = naming[slot]
                elif slot is not None:
                    answers.append(result)  # loaded by the caller, once all succeeded
            elif error is None and status == _FATAL_ERROR:
                error = pg_errors.error_from_result(result, encoding=self._encoding)
            elif error is None and status != _PIPELINE_ABORTED:
                error = psycopg.InterfaceError(f"unexpected answer in a pipeline: {status!r}")
        if error is not None:
            raise error
        return answers

    def answer(self, result: Any) -> Answer:
        """A statement's result with its rows loaded, as psycopg's cursor loads them."""
        tx = self._tx
        tx.set_pgresult(result)
        found = result.ntuples
        rows = tx.load_rows(0, found, tuple) if found else []
        count = result.command_tuples
        return Answer(rows, -1 if count is None else count, result)

    def _result(self, sending: Any) -> Any:
        """The last result of the statement ``sending`` sends; its error raised as psycopg
        does. Sent inside ``Connection.wait``, as psycopg sends: an interrupt there cancels
        the statement and reads its answer, never leaving the connection busy."""
        results = self.conn.wait(sending)
        for result in results:
            status = result.status
            if status not in (_COMMAND_OK, _TUPLES_OK):
                raise pg_errors.error_from_result(result, encoding=self._encoding)
        return results[-1]


class _Bound(NamedTuple):
    """A statement ready to send: its key (text and parameter types), PostgreSQL's own
    text, the types, the dumped values and their formats."""

    key: tuple[str, tuple[int, ...]]
    query: bytes
    types: tuple[int, ...]
    dumped: Any
    formats: Any


def _sent(pgconn: Any, send: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``send`` (one of ``pgconn``'s) and read the answer: a generator for
    ``Connection.wait``, so that the sending too is inside the wait."""
    send(*args, **kwargs)
    return (yield from generators.execute(pgconn))


def _pipelined(
    pgconn: Any, commands: list[tuple[bool, bytes, Any, Any]], count: int, begin: bool, commit: bool
) -> Any:
    """Send ``commands`` (each a statement to prepare, or a prepared one to run), after
    BEGIN and before COMMIT as asked, in pipeline mode with a sync; read every answer,
    each a list of results, the sync's last (for ``Connection.wait``)."""
    pgconn.enter_pipeline_mode()
    if begin:
        pgconn.send_query_params(b"BEGIN", None)
    for prepare, name, what, how in commands:
        if prepare:
            pgconn.send_prepare(name, what, param_types=how)
        else:
            pgconn.send_query_prepared(name, what, param_formats=how)
    if commit:
        pgconn.send_query_params(b"COMMIT", None)
    pgconn.pipeline_sync()
    yield from generators.send(pgconn)
    answers = []
    for _ in range(count + 1):
        answers.append((yield from generators.fetch_many(pgconn)))
    return answers


def _leave_pipeline(pgconn: Any) -> None:
    """Leave pipeline mode; where answers are left unread (or libpq refuses), close the
    connection instead: psycopg then finds it broken, never those answers."""
    if pgconn.status == _OK and not pgconn.is_busy():
        try:
            pgconn.exit_pipeline_mode()
            return
        except psycopg.Error:
            pass
    if pgconn.status == _OK:
        pgconn.finish()
