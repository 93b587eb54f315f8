"""The PostgreSQL dialect: one database shared by several processes or machines.

``postgresql://user:password@host:port/dbname`` (``postgres://`` works too), with
any libpq parameter in the query string (``sslmode=require``,
``host=/run/postgresql`` for a unix socket, ``connect_timeout=5``, ...). Left
unset, durably sends ``connect_timeout=10``, ``application_name=durably`` and
``options=-c lock_timeout=5000`` (a row stays locked by another executor's
transaction for at most 5 s before the verb fails with DatabaseLocked, as a
SQLite file stays busy for at most ``busy_timeout``).

Transactions. The connection is in autocommit mode and every batch opens its
own transaction with an explicit ``BEGIN``, exactly as the SQLite dialect does,
so the transaction boundaries are the ones :meth:`SqlStore.run_batch` draws and
nothing is begun behind its back. The ``BEGIN`` is sent with the batch's first
statement, pipelined, and a step's fence and journal write are one statement
(``fence_and_write_entry``). A batch that is only that statement (a plain step's
commit, alone in its batch) is sent without ``BEGIN`` and ``COMMIT``, as a
transaction of its own: one round trip.
Isolation is READ COMMITTED: every verb that decides on a row does so in one
conditional UPDATE or a ``SELECT ... FOR UPDATE`` (``claim``, the fence of
``append_entries``), whose row lock makes a rival wait and then re-check its
WHERE clause against the committed row, so of two claims on the same epoch
exactly one updates a row.

Connections. ``?connections=N`` (1 unless given, at most 64) store threads
(:class:`~durably.storage.thread.StoreThread`) take batches from one queue, each
on a connection of its own: while one batch waits for its COMMIT (a disk flush
on the server) or for a row lock, the next runs on another. With more than one,
two calls that were not awaited one after the other may commit in either order
(with one they commit in the order they were made, or together). A batch's calls
take their workflows' rows in id order (``base.lock_order``), and verbs that lock
many workflows' rows at once (the heartbeat, ``request_cancel``, ...) run
alone (``marks.alone``), so two batches seldom wait for each other in a cycle; a
call the server still undoes to end a deadlock runs again, alone
(``StoreThread``). When a connection is lost (a server restart, a failover, a
network cut) the batch that was running on it fails with DatabaseUnavailable --
its outcome is unknown if the loss hit its COMMIT -- and that thread's next
batch connects again. A batch that finds the connection dead before it ran
anything (the server restarted while we were idle) reconnects at once: nothing
of it had committed.

Claiming. ``claim_next`` selects the claimable rows ``FOR UPDATE SKIP LOCKED``
and claims them in the same transaction: concurrent claimers on any number of
machines take disjoint rows without waiting for each other. The rows of no queue
are picked and claimed in one statement (``claim_unqueued``), a queue's one row
at a time (``claim_and_record``), and the connection's table of runnable
workflows is written only when that set changed: a pass is two round trips.
Claimers of one queue lock its row in ``queues`` first, so they count its
running workflows and recent starts one at a time (the limits hold across machines).

A schema of its own. durably's tables live in the schema ``durably`` (or the one
``?schema=NAME`` names: lowercase letters, digits and ``_``), created on first use
under the migration lock, beside whatever else the database holds; each
connection sets ``search_path`` to it. A schema holding tables that are not
durably's is refused. A database laid out by an earlier durably (its tables in
the role's default schema, normally ``public``) is found and kept where it is.

Wake-ups. Verbs that make something claimable or deliver a signal send a
``NOTIFY`` on the schema's channel (``durably.<schema>``; ``durably`` for the
old layout in ``public``, as earlier versions did) in their transaction
(delivered only if it commits).
:meth:`PostgresStore.listen` holds a second connection, in its own thread,
that LISTENs and hands each wake-up to the engine; when that connection is
lost it reconnects with back-off and reports ``work``, since notifications sent
meanwhile are gone. Executors still poll, rarely, as the fallback.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.pq
from psycopg import sql as pgsql

from durably import errors
from durably.storage import (
    base,
    marks,
    pg_direct,
    pg_listener,
    pg_statements,
    pg_wakeup,
    sqlbase,
    thread,
)

log = logging.getLogger("durably")

#: libpq parameters durably sets when the URL leaves them out.
DEFAULTS = {
    "connect_timeout": "10",
    "application_name": "durably",
    "options": "-c lock_timeout=5000",
}

#: How many connections, each with its own store thread, a process opens unless the URL
#: says ``?connections=N``: concurrent workflows' commits run on them side by side. One by
#: default: calls then commit in the order they were made, which code that starts a
#: workflow and goes on without awaiting the start's commit may rely on (see
#: docs/decisions.md).
DEFAULT_CONNECTIONS = 1

#: How long a statement on the event loop's thread (``run_inline``) waits for a row lock
#: before the call goes to a store thread instead, which waits as long as it must.
INLINE_LOCK_TIMEOUT = "2ms"

#: The rest of the limits of that connection: a statement the server runs longer than this
#: is cancelled (it did nothing: the call goes to a store thread), and a network that goes
#: silent is found within about eight seconds (TCP keepalives and tcp_user_timeout), unless
#: the URL sets these itself.
INLINE_STATEMENT_TIMEOUT = "5s"
INLINE_NETWORK = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "1",
    "keepalives_count": "3",
    "tcp_user_timeout": "8000",
}

#: A call on the event loop's thread that took longer than this (seconds) sends the calls
#: of a while after it through the store threads (``inline_pause``): a server or a
#: network that stalls holds the loop once, not at every step.
INLINE_SLOW = 0.02
#: The pause after a slow call is this many times as long as the call took, from
#: ``INLINE_PAUSE_MIN`` to ``INLINE_PAUSE`` seconds: the loop's thread spends at most about
#: a thirtieth of its time in stalled calls, and one hiccup (a checkpoint's fsync) does
#: not cost half a minute of commits through the threads.
INLINE_PAUSE_FACTOR = 30.0
INLINE_PAUSE_MIN = 1.0
INLINE_PAUSE = 300.0


def inline_pause(took: float) -> float:
    """Seconds of calls through the store threads after an inline call of ``took``."""
    return thread.pause_after(took, INLINE_PAUSE_FACTOR, INLINE_PAUSE_MIN, INLINE_PAUSE)


#: How long after a failed attempt a store thread tries again to open the connection of
#: the calls on the event loop's thread (seconds).
INLINE_RECONNECT = 5.0

#: The schema durably's tables go into unless the URL says ``?schema=NAME``.
DEFAULT_SCHEMA = "durably"

# A schema name durably accepts: a lowercase identifier that needs no quoting, short enough
# that its channel "durably.<schema>" fits PostgreSQL's 63-byte names; pg_ is reserved.
_SCHEMA_NAME = re.compile(r"(?!pg_)[a-z_][a-z0-9_]{0,47}\Z")

#: The key of the advisory lock that serialises concurrent migrators ("durably").
MIGRATION_LOCK = int.from_bytes(b"durably", "big")

# SQLSTATEs: lock_not_available, serialization_failure, deadlock_detected.
_LOCKED = "55P03"  # lock_not_available: lock_timeout
# serialization_failure, deadlock_detected: the server undid the transaction, whose caller
# may simply run it again (errors.TransactionConflict).
_CONFLICTED = frozenset({"40001", "40P01"})
_CANCELLED = "57014"  # query_canceled: the inline connection's statement_timeout
_READ_ONLY = "25006"  # read_only_sql_transaction: a hot standby, or default_transaction_read_only
# Class 08 (connection exception), 57P01-57P03 (admin/crash shutdown, cannot connect now),
# 3D000 (the database does not exist, e.g. dropped under us).
_LOST_PREFIXES = ("08", "57P")
# Class 53, insufficient resources (53100 disk_full, 53200 out_of_memory, ...): no room now,
# perhaps later.
_NO_ROOM = "53"
# Classes 22 (data exception), 23 (integrity constraint violation) and 54 (program limit
# exceeded): the same value is refused every time...
_REFUSED = ("22", "23", "54")
# ...except the conflicts of concurrent writers (unique, exclusion), which another try may win.
_CONFLICTS = frozenset({"23505", "23P01"})

# A parameter of queries.sql (":name", but not the "::" of a cast), a string literal or a
# comment (copied as they are, "%" escaped), or a "%" anywhere else (escaped for psycopg).
_TOKEN = re.compile(r"'(?:[^']|'')*'|--[^\n]*|::|(?<![:\w]):(?P<name>[A-Za-z_]\w*)|%")


def _paramstyle(sql_text: str) -> str:
    def rewrite(match: re.Match[str]) -> str:
        token: str = match.group(0)
        if match.group("name"):
            return f"%({match.group('name')})s"
        return token.replace("%", "%%")

    return _TOKEN.sub(rewrite, sql_text)


def split_schema(url: str, name: str = "schema") -> tuple[str, list[str]]:
    """The URL without its ``schema`` (or ``name``) query parameters (libpq knows none),
    and their values."""
    head, sep, rest = url.partition("?")
    if not sep:
        return url, []
    query, hash_, fragment = rest.partition("#")
    kept, found = [], []
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if urllib.parse.unquote_plus(key) == name:
            found.append(urllib.parse.unquote_plus(value))
        elif part:
            kept.append(part)
    rebuilt = head + ("?" + "&".join(kept) if kept else "")
    return rebuilt + hash_ + fragment, found


def channel_for(schema: str, legacy: bool = False) -> str:
    """The NOTIFY channel of the durably tables in ``schema``.

    ``durably`` for the layout of earlier versions (tables in public or the role's
    default schema), so that old and new workers on such a database still wake each
    other; ``durably.<schema>`` otherwise, so two schemas of one database never do.
    """
    return sqlbase.CHANNEL if legacy or schema == "public" else f"{sqlbase.CHANNEL}.{schema}"


def redact(url: str) -> str:
    """The URL with its password (in the authority or the query) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "postgresql://(a URL that cannot be parsed)"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    query = "&".join(
        f"{k}=***" if k == "password" else f"{k}={v}"
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    # Not urlunsplit: it drops the "//" of an empty authority ("postgresql:///db?host=/run/..."
    # would be shown as "postgresql:/db?..."), which is how a unix-socket URL is written.
    authority = f"//{netloc}" if url.partition(":")[2].startswith("//") else netloc
    shown = f"{parts.scheme}:{authority}{parts.path}" + (f"?{query}" if query else "")
    return shown + (f"#{parts.fragment}" if parts.fragment else "")


#: Strings a language's collation sorts otherwise than by code point (case, spaces,
#: punctuation, accents, digits, CJK and an emoji): a collation that sorts them all as
#: Python does is taken to compare ids by code point.
TEXT_ORDER_PROBE = (
    "a", "B", "b", "A", "a b", "a-b", "a.c", "a_b", "ab", "aB", "Ab", "a~", "~",
    "é", "e", "f", "E", "Z", "0", "9", "10", "a\u00ff", "a\u0100", "\u4e00", "\U0001f600",
)  # fmt: skip


class PostgresStore(pg_wakeup.WakeupVerbs):
    """A Store in one schema of a PostgreSQL database (``durably`` unless the URL names one)."""

    driver_errors = (psycopg.Error,)
    skip_locked = "\nFOR UPDATE SKIP LOCKED"
    lock_row = "\nFOR UPDATE"

    def __init__(self, url: str) -> None:
        if url.split(":", 1)[0].lower() not in {"postgresql", "postgres"}:
            raise errors.DatabaseURLError(f"not a postgresql URL: {redact(url)!r}")
        super().__init__(url)
        libpq_url, schemas = split_schema(url)
        libpq_url, pools = split_schema(libpq_url, "connections")
        self.threads = _connections(pools, url)
        if len(schemas) > 1:
            raise errors.DatabaseURLError(
                f"schema= is given {len(schemas)} times in {redact(url)!r}"
            )
        if schemas and not _SCHEMA_NAME.match(schemas[0]):
            raise errors.DatabaseURLError(
                f"schema={schemas[0]!r} in {redact(url)!r} is not a schema name durably "
                "accepts: lowercase letters, digits and _, starting with a letter or _, "
                "at most 48 characters, not starting with pg_"
            )
        #: The schema named in the URL, if any: then it is used whatever else exists.
        self._named_schema = schemas[0] if schemas else None
        #: The schema durably's tables are in; settled by open() (an old layout is kept).
        self.schema = self._named_schema or DEFAULT_SCHEMA
        self.channel = channel_for(self.schema)
        self._schema_settled = False
        try:
            urllib.parse.urlsplit(url)
            params = psycopg.conninfo.conninfo_to_dict(libpq_url)
        except (ValueError, psycopg.Error) as exc:
            text = " ".join(str(exc).split())
            raise errors.DatabaseURLError(f"bad postgresql URL {redact(url)!r}: {text}") from None
        for key, value in DEFAULTS.items():
            params.setdefault(key, value)
        self._params = params
        self._conninfo = psycopg.conninfo.make_conninfo("", **params)
        self._inline_conninfo = psycopg.conninfo.make_conninfo("", **{**INLINE_NETWORK, **params})
        self._password = str(params.get("password") or "")
        self.url = redact(url)
        self._open = False
        #: The connection and transaction state every thread shares (the store is used from
        #: one thread at a time), but the threads that asked for one of their own.
        self._shared = _Session()
        self._local = threading.local()
        self._sessions_lock = threading.Lock()
        self._connections: set[psycopg.Connection[Any]] = set()  # every thread's, to close
        #: The connection of the calls made on the event loop's thread (run_inline), opened
        #: by a store thread when first wanted; never used by two threads at once.
        self._inline = _Session()
        self._inline_lock = threading.Lock()
        self._inline_wanted = False  # a store thread opens it at its next batch
        self._inline_tried = float("-inf")  # time.monotonic() of the last attempt to open it
        self._inline_paused_until = 0.0  # time.monotonic(): no inline call before it

    @property
    def where(self) -> str:
        """The database as people name it in messages: db, user, host and port, no password."""
        p = self._params
        host = p.get("host") or p.get("hostaddr") or "the default host"
        port = f":{p['port']}" if p.get("port") else ""
        user = f" as {p['user']}" if p.get("user") else ""
        return f"PostgreSQL database {p.get('dbname') or '(default)'!r} on {host}{port}{user}"

    # --- connection ------------------------------------------------------------------

    def open(self) -> None:
        self._open = True
        try:
            conn = self._connect()
            if not self._schema_settled:
                self._settle_schema(conn)
                pg_listener.use_schema(conn, self.schema)
            self.migrate()
            self.ids_in_code_point_order = self._ids_in_code_point_order(conn)
        except psycopg.Error as exc:
            mapped = self._map_error(exc)
            self.close()
            raise mapped from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every thread's connection (the store threads have stopped; an inline call
        still running on the loop's thread is waited for)."""
        with self._inline_lock:
            self._open = False
        self._drop()
        with self._sessions_lock:
            others, self._connections = self._connections, set()
        for conn in others:
            conn.close()

    def use_own_connection(self) -> None:
        # The store's other threads (StoreThread, when threads > 1); closed by close().
        self._local.session = _Session()

    # --- calls on the event loop's thread ------------------------------------------------

    def run_inline(self, op: base.Op) -> bool:
        """Run one op on the caller's thread (the event loop's, while nothing else is ready
        on it) on a connection of its own, which no store thread uses.

        On a small machine a round trip costs less than the two thread wake-ups of a
        store thread. The loop's thread never connects (a store thread opens the
        connection, at its next batch), never waits for a row lock longer than
        ``INLINE_LOCK_TIMEOUT``, and after a call slower than ``INLINE_SLOW`` leaves the
        calls of a while (``inline_pause``) to the store threads. False, having
        changed nothing, when the op must go to a store thread instead.
        """
        if not self._open or time.monotonic() < self._inline_paused_until:
            return False
        if not self._inline_lock.acquire(blocking=False):
            return False
        try:
            conn = self._inline.conn
            if conn is None or conn.closed or conn.broken:
                self._inline_wanted = True
                return False
            return self._run_inline(op)
        finally:
            self._inline_lock.release()

    def _run_inline(self, op: base.Op) -> bool:
        began = time.monotonic()
        with self._using(self._inline):
            try:
                self.run_batch([op])
            except BaseException:  # an interrupt mid-transaction must not leave it open
                self._rollback()
                raise
        took = time.monotonic() - began
        if took > INLINE_SLOW:
            self._inline_paused_until = thread.stalled(
                self.url,
                "a call",
                "the calls go through the store threads",
                began,
                took,
                inline_pause(took),
            )
        if isinstance(op.error, _Elsewhere | errors.DatabaseLocked):  # nothing of it was done
            if isinstance(op.error, _Elsewhere):
                self._inline_wanted = True
            op.error = op.result = None
            return False
        return True

    @contextlib.contextmanager
    def _using(self, session: _Session) -> Iterator[None]:
        """Run this thread's verbs on ``session`` for a while."""
        local = self._local
        own: _Session | None = getattr(local, "session", None)
        local.session = session
        session.inline = session is self._inline
        try:
            yield
        finally:
            session.inline = False
            if own is None:
                del local.session
            else:
                local.session = own

    def run_batch(self, ops: Sequence[base.Op]) -> None:
        if self._inline_wanted and not self._inline.inline:
            self._open_inline()
        super().run_batch(ops)

    def _open_inline(self) -> None:
        """Open the inline calls' connection, on a store thread (at most once in
        ``INLINE_RECONNECT`` seconds: a server that refuses is not asked at every batch)."""
        now = time.monotonic()
        if now - self._inline_tried < INLINE_RECONNECT:
            return
        self._inline_tried = now
        with self._inline_lock, self._using(self._inline):
            self._inline_wanted = False
            conn = self._inline.conn
            if conn is not None and not conn.closed and not conn.broken:
                return  # another store thread opened it meanwhile
            try:
                conn = self._connect(self._inline_conninfo)
                conn.execute(  # two commands: one round trip, never a prepared statement
                    f"SET lock_timeout = '{INLINE_LOCK_TIMEOUT}'; "
                    f"SET statement_timeout = '{INLINE_STATEMENT_TIMEOUT}'",
                    prepare=False,
                )
            except (psycopg.Error, errors.StoreError) as exc:
                self._drop()
                log.debug("%s: no connection for inline calls: %s", self.url, exc)

    @property
    def conninfo(self) -> str:
        """libpq's connection string for this database: the URL without durably's own
        options, with durably's defaults (a connect timeout, a lock timeout) where it sets
        none."""
        return self._conninfo

    @property
    def _session(self) -> _Session:
        """The calling thread's connection and transaction state."""
        session: _Session = getattr(self._local, "session", self._shared)
        return session

    @property
    def _begin_pending(self) -> bool:
        """This thread's batch began (``_begin``) but its BEGIN is not sent yet: it goes with
        the first statement, pipelined, so a one-statement step costs BEGIN, it and COMMIT
        two round trips."""
        return self._session.begin_pending

    @_begin_pending.setter
    def _begin_pending(self, pending: bool) -> None:
        self._session.begin_pending = pending

    def _connect(self, conninfo: str | None = None) -> psycopg.Connection[Any]:
        self._drop()
        try:
            # psycopg prepares nothing: pg_direct prepares the store's statements at their
            # first use, and psycopg, holding no names, never sends the DEALLOCATE ALL
            # that would take them after a ROLLBACK. (The server still plans a prepared
            # statement afresh at each of its first five runs, then keeps a generic plan.)
            conn = psycopg.connect(
                conninfo or self._conninfo, autocommit=True, prepare_threshold=None
            )
        except psycopg.Error as exc:
            raise errors.DatabaseUnavailable(
                f"cannot connect to {self.where}: {self._scrub(exc)}"
            ) from None
        self._session.conn = conn
        self._session.temp = sqlbase.TempTables()  # a new connection has no temporary table
        with self._sessions_lock:
            self._connections.add(conn)
        if self._schema_settled:
            try:
                pg_listener.use_schema(conn, self.schema)
            except psycopg.Error as exc:
                self._drop()
                raise errors.DatabaseUnavailable(
                    f"cannot connect to {self.where}: {self._scrub(exc)}"
                ) from None
        return conn

    def _settle_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Choose the schema: the URL's; else ``durably``, unless an earlier durably laid
        this database out in the role's default schema (normally public): then that one."""
        if self._named_schema is None:
            row = conn.execute(
                "SELECT to_regclass(%(ours)s) IS NOT NULL, current_schema(), "
                "to_regclass(quote_ident(current_schema()) || '.durably_migrations') IS NOT NULL",
                {"ours": f"{DEFAULT_SCHEMA}.durably_migrations"},
            ).fetchone()
            assert row is not None  # a SELECT without FROM has one row
            ours, default, legacy = row
            if legacy and not ours:
                self.schema = str(default)
                self.channel = channel_for(self.schema, legacy=True)
                log.info("%s: durably's tables are in schema %r (old layout)", self.url, default)
        self._schema_settled = True

    def _ids_in_code_point_order(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether this database sorts text by code point: a UTF-8 database whose
        collation sorts ``TEXT_ORDER_PROBE`` as Python does. "C" and "POSIX" do (byte
        order, in UTF-8 that of code points), as glibc's C.UTF-8 does; a language's
        collation (en_US, ICU) does not, and a search by id prefix then scans."""
        encoding = conn.execute(self._queries["pg_server_encoding"]).fetchone()
        if encoding is None or str(encoding[0]).upper() not in ("UTF8", "UTF-8"):
            return False  # another encoding's bytes are not in code point order
        probe = list(TEXT_ORDER_PROBE)
        found = conn.execute(self._queries["pg_text_order"], {"probe": probe}).fetchone()
        return found is not None and list(found[0]) == sorted(probe)

    def _drop(self) -> None:
        conn = self._session.conn
        if conn is not None:
            self._session.conn = None
            with self._sessions_lock:
                self._connections.discard(conn)
            conn.close()

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection of the open transaction; never replaced in the middle of one."""
        if not self._open:
            raise errors.DatabaseUnavailable(f"{self.url} is closed")
        if self._conn is None:
            raise errors.DatabaseUnavailable(f"lost the connection to {self.where}")
        return self._conn

    # --- dialect hooks -----------------------------------------------------------------

    def _paramstyle(self, sql_text: str) -> str:
        return _paramstyle(sql_text)

    def _execute(self, sql_text: str, params: Mapping[str, Any] | None = None) -> Any:
        session = self._session
        if session.ahead:  # the op's planned statements, sent ahead (AheadBatches._run_ahead)
            cursor = self._sent_ahead(sql_text, params)
            if cursor is not None:
                return cursor
        if session.ended:
            raise errors.StoreError(
                f"{self.where}: the op's transaction was already committed with the last "
                f"statement it promised ({session.ends_with}); this statement was not "
                f"sent: {sql_text.split()[0]} ..."
            )
        if not session.begin_pending:
            if session.commit_with:
                return self._end_with(sql_text, params)
            return self._direct(self.conn).execute(sql_text, params)
        session.begin_pending = False
        alone = session.skip_begin
        session.skip_begin = False
        conn = self.conn
        try:
            return self._send_first(conn, sql_text, params, alone)
        except psycopg.OperationalError:
            if not conn.broken:
                raise
            if session.inline:  # connecting is a store thread's work, not the loop's
                raise _Elsewhere(self.where) from None
            # The connection died while idle; nothing of this batch reached the server, or
            # only inside a transaction that dies with the connection: send it all again.
            # (A statement sent alone may have committed before the connection went: each
            # such statement is one whose second sending finds its own write, see
            # EntryVerbs._wrote and ClaimVerbs.create_workflow.)
            lost = session.temp
            conn = self._connect()
            self._carry_temp_tables(lost)  # what the batch's statements may rely on
            return self._send_first(conn, sql_text, params, alone)

    def _send_first(
        self, conn: psycopg.Connection[Any], sql_text: str, params: Any, alone: bool
    ) -> Any:
        """A batch's first statement: ``alone``, the whole batch, sent as a transaction of
        its own (autocommit); else BEGIN and it, pipelined: one round trip either way."""
        direct = self._direct(conn)
        if alone:
            return direct.execute(sql_text, params)
        answers = direct.begin_with([(sql_text, params)])
        return _begin_with(conn, sql_text, params) if answers is None else answers[0]

    def _direct(self, conn: psycopg.Connection[Any]) -> pg_direct.Direct:
        """What sends ``conn``'s statements past psycopg's cursors (``pg_direct``)."""
        session = self._session
        direct = session.direct
        if direct is None or direct.conn is not conn:
            direct = session.direct = pg_direct.Direct(conn)
        return direct

    def _end_with(self, sql_text: str, params: Mapping[str, Any] | None) -> Any:
        """The op's last statement (``OneStatementVerbs._ending``) in its open transaction,
        pipelined with COMMIT; after it, a statement of the same op is refused (``_execute``).
        (One that would begin the transaction goes as usual, and COMMIT after it.)"""
        session = self._session
        session.commit_with = False
        conn = self.conn
        # Either raises if either failed: then nothing was committed.
        direct = self._direct(conn)
        result = direct.end_with(sql_text, params)
        if result is None:  # what psycopg must send (pg_direct.Direct.end_with)
            with conn.pipeline():
                cursor = conn.execute(sql_text, params)
                conn.execute("COMMIT")
            session.ended = True
            return cursor
        session.ended = True  # committed: a row that fails to load is an error after it
        return direct.answer(result)

    def _begin(self, write: bool) -> None:
        if not self._open:
            raise errors.DatabaseUnavailable(f"{self.url} is closed")
        conn = self._conn
        if conn is None or conn.closed:  # lost during an earlier batch
            if self._session.inline:
                raise _Elsewhere(self.where)
            self._connect()
        # Sent with the batch's first statement (_execute), in one round trip.
        self._begin_pending = True

    def _begin_again(self) -> None:
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            self._begin_pending = True  # the statement before was a transaction of its own

    def _commit(self) -> None:
        if self._begin_pending:  # nothing was sent: nothing to commit
            self._begin_pending = False
            return
        status = self.conn.info.transaction_status
        if status == psycopg.pq.TransactionStatus.IDLE:  # one statement, committed alone
            return
        if status == psycopg.pq.TransactionStatus.INERROR:
            # PostgreSQL answers COMMIT of an aborted transaction with a silent ROLLBACK.
            self._rollback()
            raise errors.StoreError(
                f"{self.where}: the transaction was aborted by an error that was caught "
                "and ignored; nothing of it was committed"
            )
        self._direct(self.conn).commit()

    def _abort(self) -> None:
        self._begin_pending = False
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._drop()  # in an unknown state: the next batch starts on a new connection

    def _temp_tables(self) -> sqlbase.TempTables:
        return self._session.temp

    def _run_alone(self, op: base.Op) -> None:
        session = self._session
        # Only a verb called as itself: a function that calls verbs (and may fail after
        # one) needs its transaction, whatever the verbs it calls would send alone.
        session.solo = getattr(op.fn, "__self__", None) is self
        # A one-statement read is its own transaction: one round trip, not BEGIN with it
        # and a COMMIT after.
        session.skip_begin = session.solo and not op.write and marks.is_one_read(op.fn)
        try:
            super()._run_alone(op)
        finally:
            session.solo = False
            session.skip_begin = False

    def _next_savepoint(self) -> None:
        # One round trip, not two; two commands cannot be one prepared statement.
        self.conn.execute("RELEASE SAVEPOINT op; SAVEPOINT op", prepare=False)

    def _notify(self, channel: str, payload: str) -> None:
        params = {"channel": channel, "payload": payload}
        self._execute("SELECT pg_notify(%(channel)s, %(payload)s)", params)

    def listen(self, callback: Callable[[base.Wakeup], None]) -> Callable[[], None]:
        listener = pg_listener.Listener(
            self._conninfo, self.where, callback, self.channel, self.schema
        )
        listener.start()
        return listener.stop

    def _lock_migrations(self) -> None:
        # BEGIN takes no lock here; this one is held until the migration commits.
        self._execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": MIGRATION_LOCK})

    def _read_one_snapshot(self) -> None:
        # READ COMMITTED gives each statement a snapshot of its own, REPEATABLE READ the
        # transaction one; only the transaction's first statement may ask for it (an op
        # batched after others in one transaction reads as they do).
        if self._begin_pending:
            self._execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def _create_namespace(self) -> None:
        # Only when missing: CREATE SCHEMA needs the CREATE privilege on the database even
        # with IF NOT EXISTS, which a role given a schema made by its DBA may lack.
        found = self._execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s",
            {"schema": self.schema},
        ).fetchone()
        if found is None:
            name = pgsql.Identifier(self.schema)
            try:
                self.conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            except psycopg.errors.InsufficientPrivilege as exc:
                user = self._params.get("user") or "this role"
                raise errors.StoreError(
                    f"cannot create schema {self.schema!r} in {self.where} "
                    f"({self._scrub(exc)}): have it created for durably "
                    f"(CREATE SCHEMA {self.schema} AUTHORIZATION {user}), or "
                    f"GRANT CREATE ON DATABASE to {user}"
                ) from None

    def backup(self, path: str) -> None:
        dbname = self._params.get("dbname") or "DBNAME"
        raise errors.BackupNotSupported(
            f"durably does not back up {self.where}: use PostgreSQL's own tools, e.g. "
            f"pg_dump --schema={self.schema} --format=custom --file={path} {dbname} "
            "(consistent while workers run), restored with pg_restore, or continuous "
            "archiving for point-in-time recovery; see docs/operations.md"
        )

    @property
    def _namespace(self) -> str:
        return f"schema {self.schema!r} of {self.where}"

    _elsewhere = "give durably a schema of its own with ?schema=NAME in the URL"

    def _table_names(self) -> set[str]:
        rows = self._execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %(schema)s",
            {"schema": self.schema},
        ).fetchall()
        return {str(r[0]) for r in rows}

    def _translate(self, exc: Exception) -> BaseException:
        translated = super()._translate(exc)
        if not self._session.ended:
            return translated
        # The op's last statement went with COMMIT: what it wrote is kept. Its caller must
        # not take the op for undone (and send a signal again, say).
        return errors.StoreError(
            f"{self.where}: the op's transaction was committed, then it failed: "
            f"{type(translated).__name__}: {translated}"
        )

    def _map_error(self, exc: Exception) -> BaseException:
        if isinstance(exc, errors.DurablyError):
            return exc
        state = getattr(exc, "sqlstate", None) or ""
        text = self._scrub(exc)
        if state == _CANCELLED and self._session.inline:  # its statement_timeout: undone
            return _Elsewhere(self.where)
        if state in _CONFLICTED:
            return errors.TransactionConflict(
                f"{self.where}: the server undid this transaction to end a conflict with "
                f"another one ({text}); nothing of it was written, and it may be run again"
            )
        if state == _LOCKED:
            return errors.DatabaseLocked(
                f"{self.where}: another transaction held the rows too long or conflicted "
                f"with this one ({text}); another executor holds a long transaction"
            )
        if state == _READ_ONLY:
            return errors.DatabaseReadOnly(
                f"{self.where} cannot be written ({text}): it is a standby or read-only; "
                "point durably at the primary"
            )
        if self._lost(exc, state):
            return errors.DatabaseUnavailable(
                f"lost the connection to {self.where} ({text}); the next call reconnects"
            )
        if state.startswith(_NO_ROOM):
            return errors.StorageFull(
                f"{self.where} has no room to write (SQLSTATE {state}: {text}); free some "
                "space: runs wait and retry their writes"
            )
        refused = state.startswith(_REFUSED) and state not in _CONFLICTS
        if refused or (isinstance(exc, psycopg.DataError) and not state):  # NUL, found by psycopg
            return errors.StorageDataError(
                f"{self.where} refused a value (SQLSTATE {state or 'none, from the driver'}): "
                f"{sqlbase.ascii_text(text)}"
            )
        return errors.StoreError(f"{self.where}: {type(exc).__name__}: {text}")

    # --- helpers -------------------------------------------------------------------------

    def _lost(self, exc: Exception, state: str) -> bool:
        if self._conn is None or self._conn.closed or self._conn.broken:
            return True
        if isinstance(exc, psycopg.InterfaceError):
            return True
        if state.startswith(_LOST_PREFIXES) or state == "3D000":
            return True
        return isinstance(exc, psycopg.OperationalError) and not state

    def _scrub(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())
        return text.replace(self._password, "***") if self._password else text


class _Session:
    """A connection to the database, what its temporary tables hold, whether its batch's
    BEGIN is still to send, whether the batch is one op (``solo``: a one-statement
    verb may skip BEGIN), and whether it is the event loop's thread's (``inline``)."""

    __slots__ = (
        "ahead",
        "begin_pending",
        "commit_with",
        "conn",
        "direct",
        "ended",
        "ends_with",
        "inline",
        "one_op",
        "skip_begin",
        "solo",
        "temp",
    )

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        #: What sends this connection's statements past psycopg's cursors, once made.
        self.direct: pg_direct.Direct | None = None
        self.temp = sqlbase.TempTables()
        self.begin_pending = False
        self.solo = False
        self.skip_begin = False  # the pending statement is the whole batch: no BEGIN
        self.inline = False  # in use by the event loop's thread (run_inline)
        #: The running op's planned statements, sent ahead of its batch, each with the
        #: cursor holding its answer, until the op sends it (``_run_ahead``).
        self.ahead: list[tuple[pg_statements.Ahead, Any]] = []
        #: The verb the batch's one op promises to call last (``marks.ending_verb``).
        self.ends_with: str | None = None
        self.commit_with = False  # the next statement is the op's last: sent with COMMIT
        self.ended = False  # that statement and its COMMIT succeeded: the op's transaction ended
        self.one_op = False  # the batch is one op (run_batch)


class _Elsewhere(Exception):
    """An inline call found its connection lost before anything of it was done: a store
    thread connects again and runs it (never escapes ``run_inline``)."""


def _connections(given: list[str], url: str) -> int:
    """The ``connections=N`` of the URL: how many store threads, each with a connection."""
    if not given:
        return DEFAULT_CONNECTIONS
    if len(given) > 1 or not given[0].isdigit() or not 1 <= int(given[0]) <= 64:
        raise errors.DatabaseURLError(
            f"connections={given[-1]!r} in {redact(url)!r}: give how many connections "
            "(and store threads) each process opens, one number from 1 to 64"
        )
    return int(given[0])


def _begin_with(conn: psycopg.Connection[Any], sql_text: str, params: Any) -> Any:
    """BEGIN and the transaction's first statement, pipelined: one round trip."""
    with conn.pipeline():
        conn.execute("BEGIN")
        cursor = conn.execute(sql_text, params)
    return cursor
