"""How durably runs SQL: dialect hooks, batches of verbs in one transaction, migrations.

:class:`SqlBase` is the machinery under :class:`~durably.storage.sql.SqlStore`
(the verbs): it loads the named queries of ``queries.sql`` and the migrations
of ``migrations/``, runs a batch of verbs in one transaction (group commit; a
savepoint each only when one of them failed), and declares what a dialect
subclass provides: the connection, how a transaction begins, how parameters are
spelled, how tables
are listed, how driver errors map to durably's errors, and the two things only
a server database has -- the locking clause that lets concurrent claimers skip
each other's rows (``skip_locked``) and notifications sent on commit
(``_notify``, heard through ``Store.listen``).
"""

from __future__ import annotations

import abc
import functools
import importlib.resources
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from durably import errors
from durably.storage import base

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")

#: The NOTIFY channel (PostgreSQL) on which committed changes wake listening executors.
CHANNEL = "durably"

#: A query written with its direction open (``{past}``, ``{order}``, e.g. a page of
#: workflows) is made twice: newest first under its own name, oldest first under its
#: name + ``_oldest_first``. ``{past}`` compares with the cursor: past it is older, or newer.
_DIRECTIONS = {
    "": {"past": "<", "order": "DESC"},
    "_oldest_first": {"past": ">", "order": "ASC"},
}

#: ``{{name}}`` in a query stands for the text of the query ``name`` written above it.
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")

_MAX_PAYLOAD = 4000  # characters; PostgreSQL refuses a NOTIFY payload of 8000 bytes or more


@functools.cache
def load_queries() -> dict[str, str]:
    """Every named query of queries.sql, with parameters still written ``:name``.

    Read once per process: a store is opened many times, and a process that later
    drops its privileges (or whose package files go away) still has its SQL.
    """
    text = importlib.resources.files("durably.storage").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, sql in zip(parts[1::2], parts[2::2], strict=True):
        sql = _INCLUDE.sub(lambda m: _body(queries[m.group(1)]), sql)
        if "{order}" not in sql and "{past}" not in sql:
            queries[name] = sql.strip()
            continue
        for suffix, words in _DIRECTIONS.items():  # one query, written once, both ways
            directed = sql
            for slot, word in words.items():
                directed = directed.replace("{" + slot + "}", word)
            queries[name + suffix] = directed.strip()
    return queries


#: The most ids one statement lists (``{ids}``: ``:ids_0, :ids_1, ...``); more take more
#: statements (:func:`id_chunks`).
IDS_PER_STATEMENT = 256

#: The parameters of a search that are not filters of their own: paging, or a parameter
#: that another filter's term reads too (``after_id``, ``id_below``).
_PAGING = frozenset({"limit", "offset", "after_id", "id_below"})


def prefix_end(prefix: str) -> str | None:
    """The least string after every string that starts with ``prefix``, in code point
    order: its last character the next code point (surrogates skipped), or None when
    there is none (every character is U+10FFFF, or there are none).

    ``[prefix, prefix_end(prefix))`` is then the range of the ids starting with it,
    where text sorts by code point (SQLite's BINARY on UTF-8, a "C" collation).
    """
    head = prefix.rstrip(chr(sys.maxunicode))
    if not head:
        return None
    following = ord(head[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:
        following = 0xE000
    return head[:-1] + chr(following)


def id_chunks(ids: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """``ids`` (distinct) by :data:`IDS_PER_STATEMENT`: for each chunk, how many ``:ids_N``
    parameters its statement lists and their values. The count is the next power of two
    (the last id repeated: ``IN`` takes it once), so that few statement texts are made."""
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        chunk = ids[start : start + IDS_PER_STATEMENT]
        slots = 1
        while slots < len(chunk):
            slots *= 2
        yield slots, {f"ids_{i}": chunk[min(i, len(chunk) - 1)] for i in range(slots)}


def id_list(sql_text: str, slots: int) -> str:
    """``sql_text`` with its ``{ids}`` written as ``slots`` parameters ``:ids_0, ...``."""
    return sql_text.replace("{ids}", ", ".join(f":ids_{i}" for i in range(slots)))


def search_sql(template: str, terms: str, given: frozenset[str], ids: int = 0) -> str:
    """``template`` (search_workflows) with the ``terms`` (search_terms, of the same
    direction) of the filters ``given`` joined with AND at ``{filters}``: each a plain
    comparison that an index can serve, where a catch-all ``(:x IS NULL OR col = :x)``
    is not. ``ids`` is how many ``:ids_N`` parameters the ``ids`` filter names."""
    by_filter: dict[str, str] = {}
    last = ""
    for line in _body(terms).splitlines():
        if line[:1].isspace() and last:
            by_filter[last] += " " + line.strip()
        elif line.strip():
            last, term = line.split(None, 1)
            by_filter[last] = term.strip()
    unknown = given - by_filter.keys() - _PAGING
    if unknown:  # a filter without a term would select every workflow: never
        raise ValueError(f"search_workflows has no term for {sorted(unknown)}")
    chosen = [f"({term})" for f, term in by_filter.items() if f in given]
    return id_list(template.replace("{filters}", " AND ".join(chosen) or "TRUE"), ids)


def _body(sql_text: str) -> str:
    """A query's text without its leading comment lines (to embed it in another)."""
    lines = sql_text.splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


@functools.cache
def load_migrations() -> tuple[tuple[int, str, str], ...]:
    """(version, name, sql) of every migration file, in order (read once per process)."""
    found = []
    for res in importlib.resources.files("durably.storage.migrations").iterdir():
        match = _MIGRATION.match(res.name)
        if match:
            found.append((int(match.group(1)), match.group(2), res.read_text()))
    return tuple(sorted(found))


def split_statements(sql: str) -> Iterator[str]:
    """The statements of a migration file (no semicolons inside statements).

    Comment lines go first, so a semicolon in a comment splits nothing.
    """
    code = "\n".join(ln for ln in sql.splitlines() if not ln.strip().startswith("--"))
    for statement in code.split(";"):
        if statement.strip():
            yield statement.strip("\n")


class TempTables:
    """What one connection's temporary tables hold, as this process last wrote them, so
    that a verb need not write them again: ``runnable``, the rows of ``runnable_here``
    (``ClaimVerbs._fill_runnable``); None while unknown (a new connection, a rollback).

    A temporary table lives as long as its connection, and its rows and its creation
    roll back with the transaction that wrote them: ``SqlBase._rollback`` forgets.
    """

    __slots__ = ("runnable",)

    def __init__(self) -> None:
        self.runnable: tuple[tuple[str, str, str], ...] | None = None

    def forget(self) -> None:
        """What the tables hold is not known any more: the next verb writes them."""
        self.runnable = None


class SqlBase(base.Store):
    """A Store over a DB-API connection, without its verbs; dialects subclass SqlStore."""

    #: The driver's exception base classes, mapped by ``_map_error``.
    driver_errors: tuple[type[Exception], ...] = ()

    #: Appended to the claimable queries: where claimers run concurrently, the clause that
    #: locks the rows a claimer selects and skips those another claimer holds (PostgreSQL:
    #: ``FOR UPDATE SKIP LOCKED``). Empty where a write transaction locks the database.
    skip_locked: str = ""

    #: Appended to the fence's SELECT: the clause that locks the workflow's row for the
    #: rest of the transaction, so a signal sender or a finishing child waits for it
    #: (PostgreSQL: ``FOR UPDATE``). Empty where a write transaction locks the database.
    lock_row: str = ""

    #: The NOTIFY channel this store's wake-ups go out on (PostgreSQL: one per schema).
    channel: str = CHANNEL

    #: Whether the database compares workflow ids by code point (then the ids that start
    #: with a prefix are one range of the primary key: ``prefix_end``). Learnt by ``open``.
    ids_in_code_point_order: bool = False

    def __init__(self, url: str) -> None:
        self.url = url
        self._queries = {name: self._paramstyle(sql) for name, sql in load_queries().items()}
        #: Statements composed from queries.sql at run time (a search's filters, a list of
        #: ids), as sent, by what they were composed from: few texts (:meth:`_composed`).
        self._composed_texts: dict[tuple[Any, ...], str] = {}

    # --- dialect hooks -----------------------------------------------------------

    @abc.abstractmethod
    def _paramstyle(self, sql: str) -> str:
        """Rewrite ``:name`` parameters into the driver's style."""

    @abc.abstractmethod
    def _execute(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """Run one statement on the connection; return the cursor."""

    @abc.abstractmethod
    def _begin(self, write: bool) -> None:
        """Open a transaction (taking the write lock at once when ``write``)."""

    @abc.abstractmethod
    def _commit(self) -> None:
        """Commit the open transaction."""

    @abc.abstractmethod
    def _abort(self) -> None:
        """Abandon the open transaction, if any (``_rollback`` calls it)."""

    @abc.abstractmethod
    def _temp_tables(self) -> TempTables:
        """What the calling thread's connection's temporary tables hold: a new
        :class:`TempTables` with each new connection (one that has none)."""

    def _notify(self, channel: str, payload: str) -> None:
        """Tell listening executors, when the open transaction commits, what it may wake.

        Nothing to do where nothing listens (SQLite: executors poll).
        """

    def _next_savepoint(self) -> None:
        """Release the savepoint of the op just run and open the next op's.

        Two statements; a dialect whose driver sends both in one round trip overrides this.
        (The last savepoint needs no release: the commit keeps everything.)
        """
        self._execute("RELEASE SAVEPOINT op")
        self._execute("SAVEPOINT op")

    def _lock_migrations(self) -> None:
        """Make concurrent migrators wait for each other, inside the migration's transaction.

        Nothing to do where ``_begin(write=True)`` already takes the database's
        write lock (SQLite's BEGIN IMMEDIATE).
        """

    def _read_one_snapshot(self) -> None:
        """Make the rest of this transaction read the database as of one moment, where
        the dialect's transactions do not already (SQLite's read transaction sees the file
        as of its first read)."""

    def _create_namespace(self) -> None:
        """Create where durably's tables go, if it is missing; under the migration lock.

        Nothing to do where the tables go into the database itself (SQLite).
        """

    @property
    def _namespace(self) -> str:
        """Where durably's tables are, as messages name it."""
        return self.url

    #: What to do instead when durably's place holds someone else's tables.
    _elsewhere = "point durably at a new file or an empty database"

    @abc.abstractmethod
    def _table_names(self) -> set[str]:
        """Tables present where durably's go (to tell a foreign database from ours)."""

    @abc.abstractmethod
    def _map_error(self, exc: Exception) -> BaseException:
        """A driver error as a durably StoreError that says what and where."""

    # --- plumbing ------------------------------------------------------------------

    def _rollback(self) -> None:
        """Abandon the open transaction, if any, and with it what it wrote to the
        connection's temporary tables: what they hold is no longer known."""
        self._temp_tables().forget()
        self._abort()

    def _q(self, query: str, /, **params: Any) -> Any:
        return self._execute(self._queries[query], params)

    def _composed(self, key: tuple[Any, ...], compose: Callable[[], str]) -> str:
        """The statement ``compose`` makes (with ``:name`` parameters) in the driver's
        style, made once per ``key``."""
        sql_text = self._composed_texts.get(key)
        if sql_text is None:
            sql_text = self._composed_texts[key] = self._paramstyle(compose())
        return sql_text

    def _each_listed(self, query: str, ids: Sequence[str], suffix: str = "") -> list[Any]:
        """Run ``query``, whose ``{ids}`` lists workflow ids, for every id in ``ids`` (a
        statement per :data:`IDS_PER_STATEMENT`, in their order), with ``suffix`` appended
        (a dialect's clause, such as ``lock_row``); the rows it returned, if any."""
        found: list[Any] = []
        for slots, params in id_chunks(list(dict.fromkeys(ids))):

            def listed(slots: int = slots) -> str:
                return id_list(load_queries()[query], slots) + suffix

            cursor = self._execute(self._composed((query, slots, suffix), listed), params)
            if cursor.description is not None:
                found += cursor.fetchall()
        return found

    def _wake(self, kind: str, workflow_id: str | None = None, **extra: Any) -> None:
        """Queue a wake-up notification for when this transaction commits."""
        self._notify(self.channel, encode_wakeup(base.Wakeup(kind, workflow_id, **extra)))

    def _translate(self, exc: Exception) -> BaseException:
        """Driver errors become StoreErrors; durably's own and programming errors pass.

        A value the driver cannot encode for the database (a lone surrogate; text
        outside a LATIN1 database's repertoire) is refused data like any other.
        """
        if isinstance(exc, UnicodeError):
            return errors.StorageDataError(
                f"{self.url}: a value cannot be sent to the database: {ascii_text(str(exc))}"
            )
        return self._map_error(exc) if isinstance(exc, self.driver_errors) else exc

    def run_batch(self, ops: Sequence[base.Op]) -> None:
        if len(ops) == 1:
            self._run_one(ops[0])
            return
        if not self._begin_batch(ops):
            return
        # Optimistically without savepoints (they cost a round trip an op on a server):
        # when an op fails, everything is undone and the batch runs again, guarded.
        try:
            for op in ops:
                op.result = op.fn(*op.args)
        except Exception:
            self._rollback()
            for op in ops:
                op.result = None
            if self._begin_batch(ops):
                self._run_guarded(ops)
            return
        self._finish(ops)

    def _run_one(self, op: base.Op) -> None:
        """``run_batch([op])``: the usual batch (an inline commit, a quiet store thread)."""
        try:
            self._begin(op.write)
        except Exception as exc:
            op.error = self._translate(exc)
            return
        self._run_alone(op)

    def _begin_batch(self, ops: Sequence[base.Op]) -> bool:
        """Open the batch's transaction; False, with every op failed, if it cannot be."""
        try:
            self._begin(any(op.write for op in ops))
        except Exception as exc:
            mapped = self._translate(exc)
            for op in ops:
                op.error = mapped
            return False
        return True

    def _run_guarded(self, ops: Sequence[base.Op]) -> None:
        """Run the ops with a savepoint each: one that fails is undone alone.

        One the database undid to end a deadlock (``TransactionConflict``) is run again
        later (``StoreThread``), so the batch's later ops of its workflow are not run
        here but left with the same error: run again after it, they keep their order.
        """
        conflicted: dict[str, errors.TransactionConflict] = {}
        try:
            self._execute("SAVEPOINT op")
            for i, op in enumerate(ops):
                if i:  # the previous op is done: keep it, and mark where this one begins
                    self._next_savepoint()
                if conflicted and (named := base.workflow_named(op)) in conflicted:
                    op.error = conflicted[named]  # (only once one of this batch conflicted)
                    continue
                try:
                    op.result = op.fn(*op.args)
                except Exception as exc:
                    self._execute("ROLLBACK TO SAVEPOINT op")
                    self._temp_tables().forget()  # the op's writes to them are undone too
                    op.error = self._translate(exc)
                    if isinstance(op.error, errors.TransactionConflict):
                        conflicted[base.workflow_named(op)] = op.error
        except Exception as exc:  # the transaction itself failed (a lost connection)
            self._rollback()
            self._fail_all(ops, self._translate(exc))
            return
        self._finish(ops)

    def _run_alone(self, op: base.Op) -> None:
        try:
            op.result = op.fn(*op.args)
        except Exception as exc:
            self._rollback()
            op.error = self._translate(exc)
            return
        self._finish([op])

    def _finish(self, ops: Sequence[base.Op]) -> None:
        try:
            self._commit()
        except Exception as exc:
            self._rollback()
            self._fail_all(ops, self._translate(exc))

    @staticmethod
    def _fail_all(ops: Sequence[base.Op], error: BaseException) -> None:
        """Nothing of the transaction was committed: every op that had succeeded fails."""
        for op in ops:
            if op.error is None:
                op.error = error
                op.result = None

    # --- migrations ----------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in one transaction; return the versions applied."""
        tables = self._table_names()
        if tables and "durably_migrations" not in tables:
            raise errors.NotADurablyDatabase(
                f"{self._namespace} holds tables ({', '.join(sorted(tables)[:5])}) but no "
                "durably_migrations table: it is not a durably database; "
                f"{self._elsewhere}"
            )
        if not tables and not self.create:
            raise errors.DatabaseNotFound(
                f"{self.url} holds no durably database (no tables): check the URL; "
                "`durably migrate` or an Engine creates the schema"
            )
        migrations = load_migrations()
        newest = migrations[-1][0]
        if tables:
            applied = {int(r[0]) for r in self._q("applied_migrations").fetchall()}
            if applied and max(applied) > newest:
                raise errors.SchemaTooNew(
                    f"{self.url} is at schema version {max(applied)}, newer than this "
                    f"durably understands ({newest}); upgrade durably"
                )
        else:
            applied = set()
        pending = [m for m in migrations if m[0] not in applied]
        if not pending:
            return []
        self._begin(True)
        try:
            self._lock_migrations()
            self._create_namespace()
            self._q("create_migrations_table")
            # Another process may have migrated while we waited for the lock.
            applied = {int(r[0]) for r in self._q("applied_migrations").fetchall()}
            done = []
            for version, name, sql in pending:
                if version in applied:
                    continue
                for statement in split_statements(sql):
                    self._execute(statement)
                self._q("record_migration", version=version, name=name, now=time.time())
                done.append(version)
            self._commit()
        except Exception:
            self._rollback()
            raise
        return done

    def schema_version(self) -> int:
        rows = self._q("applied_migrations").fetchall()
        return int(rows[-1][0]) if rows else 0


def ascii_text(text: str) -> str:
    """``text`` with every non-ASCII character escaped: a message about a refused value
    must not carry the character that was refused into the database."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def encode_wakeup(wakeup: base.Wakeup) -> str:
    """A wake-up as the payload of a notification (compact JSON, None fields left out)."""
    fields = {"k": wakeup.kind, "w": wakeup.workflow_id, "n": wakeup.name, "t": wakeup.at}
    text = json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))
    return text if len(text) < _MAX_PAYLOAD else '{"k":"work"}'  # too long for NOTIFY


def decode_wakeup(payload: str) -> base.Wakeup:
    """The wake-up a notification carries; a payload it cannot read wakes for ``work``."""
    try:
        data = json.loads(payload)
        return base.Wakeup(str(data["k"]), data.get("w"), data.get("n"), data.get("t"))
    except (ValueError, KeyError, TypeError):
        return base.Wakeup("work")
