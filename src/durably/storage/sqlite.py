"""The SQLite dialect: one file in WAL mode, the embedded default.

``sqlite:///path/to/file.db`` (relative) or ``sqlite:////abs/path.db``. Query
options: ``synchronous=full`` (the default: a committed step survives power
loss) or ``normal`` (survives a crash of the process but not of the machine),
and ``busy_timeout`` in milliseconds (default 5000).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Mapping
from typing import Any

from durably import errors
from durably.storage import base, sql


class SqliteStore(sql.SqlStore):
    """A Store on one SQLite file, shared safely by several processes on one host."""

    driver_errors = (sqlite3.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "sqlite":
            raise errors.DurablyError(f"not a sqlite URL: {url!r}")
        path = urllib.parse.unquote(parsed.path)
        # sqlite:///rel.db -> "/rel.db" -> "rel.db"; sqlite:////abs.db -> "//abs.db" -> "/abs.db"
        self.path = path[1:] if path.startswith("/") else path
        if not self.path:
            raise errors.DurablyError(f"no file in sqlite URL {url!r} (use sqlite:///file.db)")
        options = dict(urllib.parse.parse_qsl(parsed.query))
        self.synchronous = options.get("synchronous", "full").upper()
        if self.synchronous not in {"FULL", "NORMAL", "EXTRA"}:
            raise errors.DurablyError(
                f"synchronous={options['synchronous']!r} in {url!r}: use full or normal"
            )
        self.busy_timeout_ms = int(options.get("busy_timeout", "5000"))
        self._conn: sqlite3.Connection | None = None

    def _paramstyle(self, sql_text: str) -> str:
        return sql_text  # sqlite3 reads :name natively

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise errors.DatabaseUnavailable(f"{self.url} is closed")
        return self._conn

    def open(self) -> None:
        if not self.create and not os.path.exists(self.path):
            raise errors.DatabaseNotFound(
                f"no SQLite database at {os.path.abspath(self.path)!r} (from {self.url}): "
                "check the path (sqlite:///relative.db, sqlite:////absolute.db); "
                "`durably migrate` or an Engine creates a new one"
            )
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
            self._execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._execute(f"PRAGMA synchronous = {self.synchronous}")
            # Migrate first: it refuses a foreign database before anything is written,
            # whereas switching to WAL rewrites the file header.
            self.migrate()
            mode = self._execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                self._execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            self.close()
            raise self._map_error(exc) from exc
        except BaseException:
            self.close()
            raise

    def run_inline(self, op: base.Op) -> bool:
        """Commit one op here, unless another process holds the write lock right now."""
        self._execute("PRAGMA busy_timeout = 0")
        try:
            self.run_batch([op])
        except BaseException:  # an interrupt mid-transaction must not keep the write lock
            self._rollback()
            raise
        finally:
            self._execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        if isinstance(op.error, errors.DatabaseLocked):  # rolled back: the thread waits
            op.error = None
            return False
        return True

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def _execute(self, sql_text: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.conn.execute(sql_text, params or {})

    def _begin(self, write: bool) -> None:
        self._execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _commit(self) -> None:
        self._execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn is not None and self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _table_names(self) -> set[str]:
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_")}

    def _map_error(self, exc: Exception) -> BaseException:
        if isinstance(exc, errors.DurablyError):
            return exc
        text = str(exc)
        where = f"SQLite database {self.path!r}"
        if "file is not a database" in text or "malformed" in text:
            return errors.NotADurablyDatabase(f"{where} is not a SQLite database ({text})")
        if "readonly" in text or "read-only" in text:
            return errors.DatabaseReadOnly(
                f"{where} cannot be written ({text}): check the permissions of the file "
                "and of its directory (SQLite needs to create the -wal and -shm files there)"
            )
        if "locked" in text or "busy" in text:
            return errors.DatabaseLocked(
                f"{where} stayed locked for {self.busy_timeout_ms} ms ({text}); another "
                "process holds a long write transaction"
            )
        if "unable to open" in text:
            return errors.DatabaseUnavailable(f"cannot open {where} ({text})")
        return errors.StoreError(f"{where}: {type(exc).__name__}: {text}")
