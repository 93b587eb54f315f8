"""A statement sent straight through libpq, without psycopg's cursor around it.

A statement through ``Connection.execute`` costs this process 60-80 µs of CPU on the
development VM, for a one-row ``INSERT``; the same prepared statement sent through the
connection's libpq object (``pgconn``) costs about 30 (issue 12, seventeenth pass).
The rest is psycopg's cursor: a new one a statement, its query conversion, its
prepared-statement manager and its generators, all in Python. A plain step's commit, a
start and a finish are each one statement alone (``_alone``), so the difference is a
tenth of a step and more than a tenth of a 1-step workflow's client time.

:class:`Direct` sends such statements itself and keeps what psycopg would do with them:
the parameters are dumped and the rows loaded by psycopg's own ``Transformer`` (the
same types both ways, JSON included), the errors are psycopg's (``error_from_result``,
the same SQLSTATE classes ``PostgresStore._map_error`` reads) and the wait is psycopg's
(``Connection.wait``, which releases the GIL and cancels the query on an interrupt).
Each statement is prepared at its first use on the connection, under a name of its own
(``durably_N``, never reused), as psycopg does with ``prepare_threshold=0``.

Only a statement that is a transaction of its own (the connection idle, in autocommit)
goes this way. psycopg sends ``DEALLOCATE ALL`` after a ``ROLLBACK``, a ``DROP`` or an
``ALTER`` it runs, which takes ours too; the server then refuses the name at ``Bind``,
before anything ran, and outside a transaction the statement is simply prepared again
and sent again. Inside one the refusal would abort it, so a statement there, a composed
query, one in pipeline mode, and any past ``PREPARED_MAX`` go through psycopg as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer

#: How many statements one connection prepares here; past that, the rest go through
#: psycopg (which keeps its own, least recently used first out).
PREPARED_MAX = 128

# A psycopg-style parameter ("%(name)s") or an escaped "%" (``postgres._paramstyle``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")

_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_PIPELINE_OFF = pq.PipelineStatus.OFF
_IDLE = pq.TransactionStatus.IDLE
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
        """Run one statement; an :class:`Answer`, or psycopg's cursor where psycopg must."""
        conn = self.conn
        pgconn = self._pgconn
        if (
            type(sql_text) is not str
            or not (params is None or type(params) is dict)
            or pgconn.transaction_status != _IDLE
            or pgconn.pipeline_status != _PIPELINE_OFF
        ):
            return conn.execute(sql_text, params)
        converted = self._texts.get(sql_text)
        if converted is None:
            converted = self._texts[sql_text] = positional(sql_text)
        query, names = converted
        tx = self._tx
        if names and (params is None or not params.keys() >= set(names)):
            return conn.execute(sql_text, params)  # psycopg names what is missing
        values = [params[name] for name in names] if params else []
        dumped = tx.dump_sequence(values, [_AUTO] * len(values))
        types = tx.types or ()
        key = (sql_text, types)
        name = self._prepared.get(key)
        if name is None:
            if len(self._prepared) >= PREPARED_MAX:
                return conn.execute(sql_text, params)
            name = self._prepared[key] = self._prepare(query, types)
        try:
            result = self._result(_send_prepared(pgconn, name, dumped, tx.formats))
        except pg_errors.InvalidSqlStatementName:  # deallocated by psycopg: nothing ran
            self._prepared.clear()  # (it deallocates all of them)
            name = self._prepared[key] = self._prepare(query, types)
            result = self._result(_send_prepared(pgconn, name, dumped, tx.formats))
        tx.set_pgresult(result)
        found = result.ntuples
        rows = tx.load_rows(0, found, tuple) if found else []
        count = result.command_tuples
        return Answer(rows, -1 if count is None else count, result)

    def _prepare(self, query: bytes, types: tuple[int, ...]) -> bytes:
        name = b"durably_%d" % self._made
        self._made += 1
        self._result(_send_prepare(self._pgconn, name, query, types))
        return name

    def _result(self, sending: Any) -> Any:
        """The last result of the statement ``sending`` sends; its error raised as psycopg
        does. Sent inside ``Connection.wait``, as psycopg sends: an interrupt there cancels
        the statement and reads its answer, never leaving the connection busy."""
        results = self.conn.wait(sending)
        for result in results:
            status = result.status
            if status != _COMMAND_OK and status != _TUPLES_OK:
                raise pg_errors.error_from_result(result, encoding=self._encoding)
        return results[-1]


def _send_prepared(pgconn: Any, name: bytes, values: Any, formats: Any) -> Any:
    """Send a prepared statement and read its results (a generator for ``Connection.wait``)."""
    pgconn.send_query_prepared(name, values, param_formats=formats)
    return (yield from generators.execute(pgconn))


def _send_prepare(pgconn: Any, name: bytes, query: bytes, types: tuple[int, ...]) -> Any:
    """Prepare a statement and read the answer (a generator for ``Connection.wait``)."""
    pgconn.send_prepare(name, query, param_types=types)
    return (yield from generators.execute(pgconn))
