"""The scratch databases ``durably bench`` measures in: beside the database it is given,
never in it, and removed at the end.

On SQLite, two files in the database file's own directory (the same disk and file
system, which is most of what a commit costs): one for durably's tables, one for the
raw baseline, each with the URL's own ``synchronous``. On PostgreSQL, two schemas of
the same database (the same server, network and settings): one for durably's tables,
one for the baseline's table. The database the URL names is never opened as durably's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sqlite3
import urllib.parse
import warnings
from collections.abc import Iterator
from typing import Any

from durably import errors
from durably.bench import workloads
from durably.storage import create_store

_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


@dataclasses.dataclass
class Scratch:
    """Where one run measures: durably's URL, the raw baseline, and what to tell the user."""

    url: str  # durably's scratch database, with the options of the URL given
    raw: workloads.Raw  # the baseline, open and warm
    setting: str  # "SQLite FULL", "SQLite NORMAL", "PostgreSQL 15.18"
    where: str  # where the scratch lives, for the report's header


@contextlib.contextmanager
def scratch(url: str) -> Iterator[Scratch]:
    """The scratch databases beside the one ``url`` names, removed when the block ends
    (however it ends). A URL durably cannot use raises its DatabaseURLError; a place it
    cannot write to, a DurablyError that says where."""
    store = create_store(url)  # the URL's own checks and messages, nothing opened
    if url.split(":", 1)[0].lower() == "sqlite":
        with _sqlite(url) as found:
            yield found
    else:
        with _postgres(url, store.url) as found:
            yield found


@contextlib.contextmanager
def _sqlite(url: str) -> Iterator[Scratch]:
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.unquote(parts.path)
    path = path[1:] if path.startswith("/") else path
    if path == ":memory:" or path.startswith("file::memory:"):
        raise errors.DatabaseURLError(
            f"durably bench measures a database on disk, not {url!r}: give a file's URL"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise errors.DatabaseNotFound(
            f"no directory {directory!r} for {url!r}: durably bench writes its scratch "
            "files beside the database file"
        )
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    synchronous = options.get("synchronous", "full").lower()
    stem = os.path.join(directory, f".durably-bench-{os.getpid()}-{secrets.token_hex(3)}")
    own, raw_path = f"{stem}.db", f"{stem}-raw.db"
    query = f"?{parts.query}" if parts.query else ""  # synchronous= and the rest, as given
    scratch_url = f"sqlite:///{urllib.parse.quote(own)}{query}"
    try:
        try:
            raw = workloads.RawSqlite(raw_path, synchronous)
        except (OSError, sqlite3.Error) as exc:
            raise errors.DatabaseUnavailable(
                f"cannot write a scratch file in {directory!r}: {exc}"
            ) from None
        try:
            yield Scratch(scratch_url, raw, f"SQLite {synchronous.upper()}", f"{stem}*.db")
        finally:
            raw.close()
    finally:
        for path_ in (own, raw_path):
            for side in _SQLITE_SIDE_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path_ + side)


@contextlib.contextmanager
def _postgres(url: str, shown: str) -> Iterator[Scratch]:
    import psycopg

    from durably.storage import postgres

    libpq_url, _ = postgres.split_schema(url)
    libpq_url, _ = postgres.split_schema(libpq_url, "connections")
    schema = f"durably_bench_{os.getpid()}_{secrets.token_hex(3)}"
    raw_schema = f"{schema}_raw"
    kept = postgres.split_schema(url)[0]  # other options (connections=N) stay as given
    scratch_url = f"{kept}{'&' if '?' in kept else '?'}schema={schema}"
    try:
        admin = psycopg.connect(libpq_url, autocommit=True)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        raise errors.DatabaseUnavailable(f"cannot connect to {shown}: {text}") from None
    try:
        try:
            admin.execute(f"CREATE SCHEMA {raw_schema}")
            found = admin.execute("SHOW server_version").fetchone()
            raw = workloads.RawPostgres(libpq_url, f"{raw_schema}.raw_journal")
        except psycopg.Error as exc:
            text = " ".join(str(exc).split())
            raise errors.DatabaseUnavailable(
                f"cannot make the scratch schema {raw_schema} in {shown}: {text} "
                "(durably bench needs CREATE on the database)"
            ) from None
        try:
            version = str(found[0]).split()[0] if found else "?"
            where = f"schemas {schema}, {raw_schema}"
            yield Scratch(scratch_url, raw, f"PostgreSQL {version}", where)
        finally:
            raw.close()
    finally:
        _drop(admin, libpq_url, shown, (schema, raw_schema))


def _drop(admin: Any, libpq_url: str, shown: str, schemas: tuple[str, ...]) -> None:
    """Drop the scratch schemas, on a new connection if the first was lost meanwhile; one
    that cannot be dropped is named in a warning, never raised over the run's outcome."""
    import psycopg

    drop = "; ".join(f"DROP SCHEMA IF EXISTS {name} CASCADE" for name in schemas)
    try:
        try:
            admin.execute(drop)
            return
        except psycopg.Error:
            pass
        with psycopg.connect(libpq_url, autocommit=True) as again:
            again.execute(drop)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        warnings.warn(
            f"durably bench could not drop its scratch schemas in {shown} ({text}): run {drop}",
            stacklevel=2,
        )
    finally:
        admin.close()
