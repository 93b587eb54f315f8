"""The SQLite dialect: one file in WAL mode, the embedded default.

``sqlite:///path/to/file.db`` (relative) or ``sqlite:////abs/path.db``. Query
options: ``synchronous=full`` (the default: a committed step survives power
loss) or ``normal`` (survives a crash of the process but not of the machine),
``busy_timeout`` in milliseconds (default 5000), and ``file_mode``: the permissions
a new database file is created with, in octal (default ``0600``: the file holds every
argument and result, so only its owner may read it; ``file_mode=0640`` lets the group
read it too). SQLite gives the -wal and -shm files the database's mode. An existing
file keeps its mode. (Not ``mode``: in SQLite's own URIs that means ro/rw/rwc.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from durably import errors
from durably.storage import base, sql, sqlbase

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

# Primary result codes (the low byte of ``sqlite_errorcode``), see sqlite.org/rescode.html.
_READONLY, _IOERR, _FULL, _CANTOPEN, _TOOBIG, _CONSTRAINT, _MISMATCH = 8, 10, 13, 14, 18, 19, 20
#: Constraint failures that are conflicts (another writer won), not a refused value.
_CONFLICTS = frozenset({1555, 2067})  # SQLITE_CONSTRAINT_PRIMARYKEY, _UNIQUE
#: How close to a limit a file (or how little free space) makes a failed write "no room":
#: SQLite writes a page or a WAL frame at a time, far less than this.
_ROOM = 1 << 20

#: The permissions of a new database file unless the URL says ``file_mode=``.
DEFAULT_FILE_MODE = 0o600

#: The most free pages one pruned batch returns to the file system (16 MiB of 4 KiB pages).
_VACUUM_PAGES = 4096

_FILE_MODE = re.compile(r"(0o?)?([0-7]{3})")


class SqliteStore(sql.SqlStore):
    """A Store on one SQLite file, shared safely by several processes on one host."""

    driver_errors = (sqlite3.Error,)
    gathers_inline = True  # a transaction here is no round trip: the loop's thread runs it

    def __init__(self, url: str) -> None:
        super().__init__(url)
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "sqlite":
            raise errors.DatabaseURLError(f"not a sqlite URL: {url!r}")
        path = urllib.parse.unquote(parsed.path)
        # sqlite:///rel.db -> "/rel.db" -> "rel.db"; sqlite:////abs.db -> "//abs.db" -> "/abs.db"
        self.path = path[1:] if path.startswith("/") else path
        if not self.path:
            raise errors.DatabaseURLError(f"no file in sqlite URL {url!r} (use sqlite:///file.db)")
        options = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        self.synchronous = options.get("synchronous", "full").upper()
        if self.synchronous not in {"FULL", "NORMAL", "EXTRA"}:
            raise errors.DatabaseURLError(
                f"synchronous={options['synchronous']!r} in {url!r}: use full or normal"
            )
        self.busy_timeout_ms = int(options.get("busy_timeout", "5000"))
        self.file_mode = _file_mode(options.get("file_mode"), url)
        self._conn: sqlite3.Connection | None = None
        #: The connection's busy_timeout now (ms): set only when it must change.
        self._lock_wait_ms = 0
        self._inline = False  # a run_inline commit is running: it must not wait for a lock
        self._temp = sqlbase.TempTables()  # the connection's (a new one with each connection)

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
            self._create_file()
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
            self._temp = sqlbase.TempTables()
            self._lock_wait_ms = 0  # connect(timeout=0)
            self._wait_for_locks(self.busy_timeout_ms)
            self._execute(f"PRAGMA synchronous = {self.synchronous}")
            if self._execute("PRAGMA page_count").fetchone()[0] == 0:
                # Only a new, empty file can take it: pruned pages can then go back to the
                # file system (_reclaim_space). See docs/operations.md.
                self._execute("PRAGMA auto_vacuum = INCREMENTAL")
            # Migrate first: it refuses a foreign database before anything is written,
            # whereas switching to WAL rewrites the file header.
            self.migrate()
            self._use_wal()
            # BINARY compares the stored bytes: code point order in UTF-8 (durably's
            # files), not in a UTF-16 file made elsewhere.
            encoding = self._execute("PRAGMA encoding").fetchone()[0]
            self.ids_in_code_point_order = str(encoding).upper() == "UTF-8"
        except sqlite3.Error as exc:
            self.close()
            raise self._map_error(exc) from exc
        except BaseException:
            self.close()
            raise

    def _use_wal(self) -> None:
        """Switch the file to WAL, unless it is already (a file's first opens do it).

        The switch needs the file to itself and does not wait for it (SQLite's busy
        handler is not called there): when several processes or threads open a new
        file at once, all but one were refused at once with "database is locked". So it
        is tried again until it is done or ``busy_timeout`` has passed.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                mode = self._execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() == "wal":
                    return
                self._execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(_WAL_RETRY)

    def _create_file(self) -> None:
        """Create a missing database file with ``file_mode`` (whatever the umask says), so
        that nothing is ever written to it world-readable; SQLite copies the mode to the
        -wal and -shm files it creates. An existing file is left as it is."""
        if self.path == ":memory:":
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode)
        except FileExistsError:
            return
        except OSError as exc:
            raise errors.DatabaseUnavailable(
                f"cannot create SQLite database {self.path!r}: {exc.strerror}"
            ) from None
        try:
            os.fchmod(fd, self.file_mode)  # the umask may have taken bits away
        finally:
            os.close(fd)

    def run_inline(self, op: base.Op) -> bool:
        """Commit one op here, unless another process holds the write lock right now."""
        return self.run_inline_batch((op,))[0]

    def run_inline_batch(self, ops: Sequence[base.Op]) -> list[bool]:
        """Commit the ops here in one transaction, unless another process holds the write
        lock right now: then none ran, and each is refused (False) for the store thread
        (refused only when nothing of the transaction was committed).

        The caller's thread (the event loop's) must never wait for a lock, the store
        thread must: ``_begin`` sets how long the connection waits only when the
        path changes, so a run of inline commits sends no statement but its own
        (one PRAGMA each way used to cost a fifth of a step on SQLite NORMAL).
        """
        self._inline = True
        try:
            self.run_batch(ops)
        except BaseException:  # an interrupt mid-transaction must not keep the write lock
            self._rollback()
            raise
        finally:
            self._inline = False
        if any(op.error is None for op in ops):  # committed: a lock error is the op's own
            return [True] * len(ops)
        done = []  # nothing committed: what the lock refused goes to the thread, which waits
        for op in ops:
            locked = isinstance(op.error, errors.DatabaseLocked)
            if locked:
                op.error = None
            done.append(not locked)
        return done

    def _reclaim_space(self) -> None:
        # Frees at most this many pages per pruned batch, so the write lock stays short; a
        # file created before auto_vacuum was set frees nothing here (docs/operations.md).
        # One page per statement: Python's sqlite3 steps this pragma once, freeing one page.
        (free,) = self._execute("PRAGMA freelist_count").fetchone()
        for _ in range(min(int(free), _VACUUM_PAGES)):
            self._execute("PRAGMA incremental_vacuum(1)")

    def backup(self, path: str) -> None:
        """Copy the database with SQLite's online backup API into the new file ``path``.

        The copy is one read transaction: a consistent snapshot, taken while
        workers keep committing (WAL readers do not block writers). It is written
        beside ``path`` under a name of its own (a file already there is never
        touched) and given the name ``path`` only once complete and on disk, by a
        hard link, which refuses a file that took the name meanwhile: ``path`` never
        names a partial copy, not even after a crash. A copy that fails on the file
        system (no room, no permission, no such directory) raises BackupError naming
        ``path`` and why, and leaves no file of its own behind.
        """
        refused = "(durably never overwrites a file: give a new path)"
        if path.endswith(("/", os.sep)):  # refused now, not once the whole copy is made
            raise errors.BackupError(
                f"cannot create the backup {path!r}: it names a directory, not a file"
            )
        if os.path.lexists(path):
            raise errors.BackupError(f"cannot create the backup {path!r}: it exists {refused}")
        try:
            fd, partial = tempfile.mkstemp(
                prefix=f"{os.path.basename(path)}.", suffix=".partial",
                dir=os.path.dirname(os.path.abspath(path)),
            )  # fmt: skip
        except OSError as exc:
            raise errors.BackupError(f"cannot create the backup {path!r}: {exc.strerror}") from None
        os.close(fd)
        try:
            self._wait_for_locks(self.busy_timeout_ms)  # not left at 0 by an inline commit
            target = sqlite3.connect(partial, isolation_level=None)
            try:
                self.conn.backup(target)
            finally:
                target.close()
            os.chmod(partial, self.file_mode)
            with open(partial, "rb+") as f:
                os.fsync(f.fileno())
            _publish(partial, path)
        except FileExistsError:
            raise errors.BackupError(
                f"cannot create the backup {path!r}: a file took the name while the "
                f"copy was made {refused}"
            ) from None
        except OSError as exc:
            raise errors.BackupError(
                f"cannot create the backup {path!r}: {exc.strerror or exc}; nothing was "
                "left under that name"
            ) from None
        except sqlite3.Error as exc:
            raise self._backup_error(path, partial, exc) from exc
        finally:
            for leftover in (partial, partial + "-journal"):  # the copy's own files
                with contextlib.suppress(OSError):
                    os.unlink(leftover)

    def _backup_error(self, path: str, partial: str, exc: sqlite3.Error) -> BaseException:
        """The error of a backup whose copy failed: writing the new file (no room, an I/O
        error, not writable) is the backup's, named by ``path``; anything else is about
        the database being copied (locked, corrupt), as any of its errors."""
        code = int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        if code not in (_IOERR, _FULL, _CANTOPEN, _READONLY):
            return self._map_error(exc)
        why = _no_room(partial) if code in (_IOERR, _FULL) else None
        reason = f"no room to write the copy: {why}" if why else "cannot write the copy"
        return errors.BackupError(
            f"cannot create the backup {path!r}: {reason} ({exc}); nothing was left under that name"
        )

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def _execute(self, sql_text: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.conn.execute(sql_text, params or {})

    def _begin(self, write: bool) -> None:
        ms = 0 if self._inline else self.busy_timeout_ms
        if ms != self._lock_wait_ms:  # checked here too: every commit passes by
            self._wait_for_locks(ms)
        self._execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _wait_for_locks(self, ms: int) -> None:
        """Make the connection wait up to ``ms`` for another connection's lock
        (``busy_timeout``), sending the PRAGMA only if that changes it."""
        if ms != self._lock_wait_ms:
            self._execute(f"PRAGMA busy_timeout = {ms}")
            self._lock_wait_ms = ms

    def _commit(self) -> None:
        self._execute("COMMIT")

    def _abort(self) -> None:
        if self._conn is not None and self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _temp_tables(self) -> sqlbase.TempTables:
        return self._temp

    def _table_names(self) -> set[str]:
        rows = self._execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_")}

    def _map_error(self, exc: Exception) -> BaseException:
        if isinstance(exc, errors.DurablyError):
            return exc
        text = str(exc)
        where = f"SQLite database {self.path!r}"
        code = int(getattr(exc, "sqlite_errorcode", 0) or 0)
        # EFBIG (a file-size limit) reaches us as a plain write error: tell it by the files.
        no_room = _no_room(self.path) if code & 0xFF in (_FULL, _IOERR) else None
        if code & 0xFF == _FULL or no_room is not None:
            return errors.StorageFull(
                f"{where} has no room to write ({no_room or 'the disk is full'}; {text}); "
                "free some space: runs wait and retry their writes"
            )
        if code & 0xFF in (_TOOBIG, _MISMATCH) or (
            code & 0xFF == _CONSTRAINT and code not in _CONFLICTS
        ):
            return errors.StorageDataError(
                f"{where} refused a value ({getattr(exc, 'sqlite_errorname', code)}): "
                f"{sqlbase.ascii_text(text)}"
            )
        if "file is not a database" in text or "malformed" in text:
            return errors.NotADurablyDatabase(f"{where} is not a SQLite database ({text})")
        if "readonly" in text or "read-only" in text:
            return errors.DatabaseReadOnly(
                f"{where} cannot be written ({text}): check the permissions of the file "
                "and of its directory (SQLite needs to create the -wal and -shm files there)"
            )
        if _is_locked(exc):
            return errors.DatabaseLocked(
                f"{where} stayed locked for {self.busy_timeout_ms} ms ({text}); another "
                "process holds a long write transaction"
            )
        if "unable to open" in text:
            return errors.DatabaseUnavailable(f"cannot open {where} ({text})")
        return errors.StoreError(f"{where}: {type(exc).__name__}: {text}")


def _no_room(path: str) -> str | None:
    """Why a write to the SQLite file ``path`` failed for lack of room, if it did: a file
    of it at this process's file-size limit (``ulimit -f``) or a file system with almost
    nothing free."""
    if resource is not None:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                size = os.path.getsize(path + suffix)
            except OSError:
                continue
            if limit != resource.RLIM_INFINITY and size + _ROOM > limit:
                return (
                    f"{path + suffix} is at this process's file-size limit "
                    f"of {limit} bytes (ulimit -f)"
                )
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        return None
    return f"its file system has {free} bytes free" if free < _ROOM else None


def _publish(partial: str, path: str) -> None:
    """Give the complete copy ``partial`` the name ``path``, never over a file there.

    A hard link does it atomically; a file system without hard links gets the name
    claimed (an empty file, for an instant) and the copy moved over it.
    """
    try:
        os.link(partial, path)
    except FileExistsError:
        raise
    except OSError:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.replace(partial, path)
        except OSError:
            with contextlib.suppress(OSError):  # the name claimed: not left empty
                os.unlink(path)
            raise
    with contextlib.suppress(OSError):  # the new name survives a power loss too
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_mode(value: str | None, url: str) -> int:
    """The ``file_mode`` option as permission bits: octal, and the owner can read and write."""
    if value is None:
        return DEFAULT_FILE_MODE
    match = _FILE_MODE.fullmatch(value)
    mode = int(match.group(2), 8) if match else 0
    if not match or mode & 0o600 != 0o600:
        raise errors.DatabaseURLError(
            f"file_mode={value!r} in {url!r}: give the new file's permissions in octal, "
            "readable and writable by its owner (e.g. 0600, the default, or 0640)"
        )
    return mode


#: Seconds between tries of the switch to WAL while another connection holds the file.
_WAL_RETRY = 0.005


def _is_locked(exc: Exception) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock it needs."""
    code = int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    text = str(exc)
    return (
        code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text or "busy" in text
    )
