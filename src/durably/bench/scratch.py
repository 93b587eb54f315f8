"""The scratch databases ``durably bench`` measures in: beside the database it is given,
never in it, and removed at the end.

On SQLite, two files in the database file's own directory (symlinks followed: the same
disk and file system, which is most of what a commit costs): one for durably's tables,
one for the raw baseline, each with the URL's own options (``synchronous=``). On
PostgreSQL, two schemas of the same database (the same server, network and settings):
one for durably's tables, one for the baseline's table. The data of the database the
URL names is never read or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from durably import errors
from durably.bench import workloads
from durably.storage import create_store
from durably.storage.sqlite import SqliteStore

if TYPE_CHECKING:
    import psycopg

    from durably.storage.postgres import PostgresStore

_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")

#: How long dropping a scratch schema waits for a lock before it gives up (and says so).
_DROP_LOCK_TIMEOUT = "10s"


@dataclasses.dataclass
class Scratch:
    """Where one run measures: durably's URL, the raw baseline, and what to tell the user."""

    url: str  # durably's scratch database, with the options of the URL given
    raw: workloads.Raw  # the baseline, open and warm
    shown: str  # the URL given, its password hidden
    setting: str  # "SQLite FULL", "SQLite NORMAL", "PostgreSQL 15.18"
    where: str  # where the scratch lives, for the report's header
    #: Another scratch database by name (lowercase letters, digits): its URL, removed with
    #: the rest (a measurement whose workflow ids repeat needs one of its own).
    another: Callable[[str], str]


@contextlib.contextmanager
def scratch(url: str, warn: Callable[[str], None]) -> Iterator[Scratch]:
    """The scratch databases beside the one ``url`` names, removed when the block ends
    (however it ends; ``warn`` says what could not be removed, and how to remove it). A
    URL durably cannot use raises its DatabaseURLError; a place it cannot write to, a
    DurablyError that says where."""
    try:
        store = create_store(url)  # the URL's own checks and messages, nothing opened
    except ValueError as exc:  # an option's value (busy_timeout=x) that is not a number
        raise errors.DatabaseURLError(f"bad database URL {url!r}: {exc}") from None
    if isinstance(store, SqliteStore):
        with _sqlite(url, store, warn) as found:
            yield found
    else:
        from durably.storage import postgres  # imported by create_store already

        assert isinstance(store, postgres.PostgresStore)
        with _postgres(url, store, warn) as found:
            yield found


@contextlib.contextmanager
def _sqlite(url: str, store: SqliteStore, warn: Callable[[str], None]) -> Iterator[Scratch]:
    if store.path == ":memory:" or store.path.startswith("file::memory:"):
        raise errors.DatabaseURLError(
            f"durably bench measures a database on disk, not {url!r}: give a file's URL"
        )
    directory = os.path.dirname(os.path.realpath(store.path))
    if not os.path.isdir(directory):
        raise errors.DatabaseNotFound(
            f"no directory {directory!r} for {url!r}: durably bench writes its scratch "
            "files beside the database file"
        )
    stem = os.path.join(directory, f".durably-bench-{os.getpid()}-{secrets.token_hex(3)}")
    own, raw_path = f"{stem}.db", f"{stem}-raw.db"
    made = [own, raw_path]
    query = urllib.parse.urlsplit(url).query  # synchronous= and the rest, as given

    def url_of(path: str) -> str:
        return f"sqlite:///{urllib.parse.quote(path)}" + (f"?{query}" if query else "")

    def another(name: str) -> str:
        made.append(f"{stem}-{_checked(name)}.db")
        return url_of(made[-1])

    setting = f"SQLite {store.synchronous}"
    try:
        try:
            raw = workloads.RawSqlite(raw_path, store.synchronous)
        except (OSError, sqlite3.Error) as exc:
            raise errors.DatabaseUnavailable(
                f"cannot write a scratch file in {directory!r}: {exc}"
            ) from None
        try:
            yield Scratch(url_of(own), raw, url, setting, f"{stem}*.db", another)
        finally:
            raw.close()
    finally:
        with _uninterrupted():
            left = []
            for path in made:
                for side in _SQLITE_SIDE_FILES:
                    try:
                        os.remove(path + side)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        left.append(path + side)
            if left:
                warn(f"durably bench could not remove {', '.join(left)}: remove them by hand")


@contextlib.contextmanager
def _postgres(url: str, store: PostgresStore, warn: Callable[[str], None]) -> Iterator[Scratch]:
    import psycopg

    from durably.storage import postgres

    schema = f"durably_bench_{os.getpid()}_{secrets.token_hex(3)}"
    raw_schema = f"{schema}_raw"
    kept = postgres.split_schema(url)[0]  # other options (connections=N) stay as given

    def url_of(name: str) -> str:
        return f"{kept}{'&' if '?' in kept else '?'}schema={name}"

    try:
        admin = psycopg.connect(store.conninfo, autocommit=True)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        raise errors.DatabaseUnavailable(f"cannot connect to {store.url}: {text}") from None
    made = [schema]  # the engine makes its schema on first use: dropped if it is there

    def another(name: str) -> str:
        made.append(f"{schema}_{_checked(name)}")
        return url_of(made[-1])

    try:
        try:
            admin.execute(f"CREATE SCHEMA {raw_schema}")
            made.insert(0, raw_schema)
            found = admin.execute("SHOW server_version").fetchone()
            raw = workloads.RawPostgres(store.conninfo, f"{raw_schema}.raw_journal")
        except psycopg.Error as exc:
            text = " ".join(str(exc).split())
            raise errors.DatabaseUnavailable(
                f"cannot make the scratch schema {raw_schema} in {store.url}: {text} "
                "(durably bench needs CREATE on the database)"
            ) from None
        try:
            version = str(found[0]).split()[0] if found else "?"
            where = f"schemas {schema} and {schema}_*"
            setting = f"PostgreSQL {version}"
            yield Scratch(url_of(schema), raw, store.url, setting, where, another)
        finally:
            raw.close()
    finally:
        with _uninterrupted():
            _drop(admin, store, made, warn)


def _drop(
    admin: psycopg.Connection[Any],
    store: PostgresStore,
    schemas: list[str],
    warn: Callable[[str], None],
) -> None:
    """Drop the scratch schemas, on a new connection if the first was lost meanwhile; when
    they cannot be dropped, ``warn`` gives the statement that drops them."""
    import psycopg

    drop = "; ".join(f"DROP SCHEMA IF EXISTS {name} CASCADE" for name in schemas)
    statement = f"SET lock_timeout = '{_DROP_LOCK_TIMEOUT}'; {drop}"
    try:
        try:
            admin.execute(statement)
            return
        except psycopg.Error:
            pass
        with psycopg.connect(store.conninfo, autocommit=True) as again:
            again.execute(statement)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        warn(f"durably bench could not drop its scratch schemas in {store.url} ({text}): {drop}")
    finally:
        admin.close()


def _checked(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9]{1,12}", name):
        raise ValueError(f"a scratch database's name is lowercase letters and digits: {name!r}")
    return name


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM held off while the scratch is removed (on the main thread, where
    Python runs signal handlers): a second Ctrl-C must not leave it behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
