"""The Store verbs written once in SQL; dialects supply only what truly differs.

Queries come from ``queries.sql`` and migrations from ``migrations/``; a dialect
subclass provides the connection, how a transaction begins, how parameters are
spelled, how tables are listed and how driver errors map to durably's errors.
"""

from __future__ import annotations

import abc
import importlib.resources
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from durably import errors, journal
from durably.storage import base

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")

_WORKFLOW_FIELDS = tuple(f.name for f in journal.WorkflowInfo.__dataclass_fields__.values())


def load_queries() -> dict[str, str]:
    """Every named query of queries.sql, with parameters still written ``:name``."""
    text = importlib.resources.files("durably.storage").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    return {name: sql.strip() for name, sql in zip(parts[1::2], parts[2::2], strict=True)}


def load_migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration file, in order."""
    found = []
    for res in importlib.resources.files("durably.storage.migrations").iterdir():
        match = _MIGRATION.match(res.name)
        if match:
            found.append((int(match.group(1)), match.group(2), res.read_text()))
    return sorted(found)


def split_statements(sql: str) -> Iterator[str]:
    """The statements of a migration file (no semicolons inside statements)."""
    for statement in sql.split(";"):
        lines = [ln for ln in statement.splitlines() if not ln.strip().startswith("--")]
        if "".join(lines).strip():
            yield "\n".join(lines)


class SqlStore(base.Store):
    """A Store over a DB-API connection; subclasses are dialects."""

    #: The driver's exception base classes, mapped by ``_map_error``.
    driver_errors: tuple[type[Exception], ...] = ()

    def __init__(self, url: str) -> None:
        self.url = url
        self._queries = {name: self._paramstyle(sql) for name, sql in load_queries().items()}

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
    def _rollback(self) -> None:
        """Abandon the open transaction, if any."""

    @abc.abstractmethod
    def _table_names(self) -> set[str]:
        """Tables present in the database (to tell a foreign database from ours)."""

    @abc.abstractmethod
    def _map_error(self, exc: Exception) -> BaseException:
        """A driver error as a durably StoreError that says what and where."""

    # --- plumbing ------------------------------------------------------------------

    def _q(self, query: str, /, **params: Any) -> Any:
        return self._execute(self._queries[query], params)

    def _translate(self, exc: Exception) -> BaseException:
        """Driver errors become StoreErrors; durably's own and programming errors pass."""
        return self._map_error(exc) if isinstance(exc, self.driver_errors) else exc

    def run_batch(self, ops: Sequence[base.Op]) -> None:
        write = any(op.write for op in ops)
        try:
            self._begin(write)
        except Exception as exc:
            mapped = self._translate(exc)
            for op in ops:
                op.error = mapped
            return
        if len(ops) == 1:
            self._run_alone(ops[0])
            return
        for op in ops:
            self._execute("SAVEPOINT op")
            try:
                op.result = op.fn(*op.args)
            except Exception as exc:
                self._execute("ROLLBACK TO SAVEPOINT op")
                op.error = self._translate(exc)
            self._execute("RELEASE SAVEPOINT op")
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
            mapped = self._translate(exc)
            for op in ops:
                if op.error is None:
                    op.error = mapped
                    op.result = None

    # --- migrations ----------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in one transaction; return the versions applied."""
        tables = self._table_names()
        if tables and "durably_migrations" not in tables:
            raise errors.NotADurablyDatabase(
                f"{self.url} holds tables ({', '.join(sorted(tables)[:5])}) but no "
                "durably_migrations table: it is not a durably database; "
                "point durably at a new file or an empty database"
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

    # --- workflows -------------------------------------------------------------------

    def create_workflow(
        self, new: base.NewWorkflow, owner: str | None, lease_expires_at: float | None, now: float
    ) -> tuple[journal.WorkflowInfo, bool]:
        status = journal.Status.RUNNING if owner else journal.Status.PENDING
        cursor = self._q(
            "create_workflow",
            workflow_id=new.workflow_id,
            name=new.name,
            version=new.version,
            source_hash=new.source_hash,
            status=status.value,
            input=new.input,
            owner=owner,
            epoch=1 if owner else 0,
            lease_expires_at=lease_expires_at,
            parent_id=new.parent_id,
            now=now,
        )
        created = cursor.rowcount == 1
        if created and owner:
            self._q(
                "insert_claim",
                workflow_id=new.workflow_id,
                epoch=1,
                owner=owner,
                now=now,
                previous_owner=None,
                reason="start",
            )
        row = self.get_workflow(new.workflow_id)
        assert row is not None
        return row, created

    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        row = self._q("get_workflow", workflow_id=workflow_id).fetchone()
        return _workflow(row) if row else None

    def list_workflows(
        self, status: str | None, name: str | None, limit: int
    ) -> list[journal.WorkflowInfo]:
        rows = self._q("list_workflows", status=status, name=name, limit=limit).fetchall()
        return [_workflow(r) for r in rows]

    def claimable(self, now: float, limit: int) -> list[journal.WorkflowInfo]:
        return [_workflow(r) for r in self._q("claimable", now=now, limit=limit).fetchall()]

    def claim(
        self,
        candidate: journal.WorkflowInfo,
        owner: str,
        lease_expires_at: float,
        now: float,
    ) -> journal.WorkflowInfo | None:
        crashed = candidate.owner is not None and candidate.status == journal.Status.RUNNING
        cursor = self._q(
            "claim",
            owner=owner,
            lease_expires_at=lease_expires_at,
            crashed=1 if crashed else 0,
            now=now,
            workflow_id=candidate.workflow_id,
            epoch=candidate.epoch,
        )
        if cursor.rowcount != 1:
            return None
        reason = "recovery" if crashed else ("resume" if candidate.epoch else "start")
        self._q(
            "insert_claim",
            workflow_id=candidate.workflow_id,
            epoch=candidate.epoch + 1,
            owner=owner,
            now=now,
            previous_owner=candidate.owner,
            reason=reason,
        )
        return self.get_workflow(candidate.workflow_id)

    def load_claims(self, workflow_id: str) -> list[journal.Claim]:
        rows = self._q("load_claims", workflow_id=workflow_id).fetchall()
        return [
            journal.Claim(str(r[0]), int(r[1]), str(r[2]), float(r[3]), r[4], str(r[5]))
            for r in rows
        ]

    def release(self, workflow_id: str, epoch: int, now: float) -> None:
        self._q("release_one", workflow_id=workflow_id, epoch=epoch, now=now)

    def release_owned(self, owner: str, now: float) -> int:
        return int(self._q("release_owned", owner=owner, now=now).rowcount)

    # --- journal ---------------------------------------------------------------------

    def load_history(self, workflow_id: str) -> list[journal.Entry]:
        rows = self._q("load_history", workflow_id=workflow_id).fetchall()
        return [
            journal.Entry(int(r[0]), r[1], r[2], r[3], int(r[4]), r[5], r[6], r[7], r[8])
            for r in rows
        ]

    def _fence(self, workflow_id: str, epoch: int, now: float) -> None:
        if self._q("fence", workflow_id=workflow_id, epoch=epoch, now=now).rowcount == 1:
            return
        row = self._q("owner_of", workflow_id=workflow_id).fetchone()
        if row is None:
            raise errors.WorkflowNotFound(f"no workflow {workflow_id!r} in {self.url}")
        raise errors.FencedError(
            f"workflow {workflow_id!r} is now at epoch {row[1]} (owner {row[0]}, "
            f"status {row[2]}); this executor held epoch {epoch} and must stop"
        )

    def _upsert(self, workflow_id: str, entries: Sequence[journal.Entry]) -> None:
        for e in entries:
            cursor = self._q(
                "upsert_entry",
                workflow_id=workflow_id,
                seq=e.seq,
                kind=e.kind,
                name=e.name,
                status=e.status,
                attempt=e.attempt,
                payload=e.payload,
                started_at=e.started_at,
                finished_at=e.finished_at,
                wake_at=e.wake_at,
            )
            if cursor.rowcount != 1:
                raise errors.StoreError(
                    f"workflow {workflow_id!r} seq {e.seq} already holds a final or a "
                    f"different entry; refusing to overwrite it with {e.describe()}"
                )

    def append_entries(
        self, workflow_id: str, epoch: int, entries: Sequence[journal.Entry], now: float
    ) -> None:
        self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries)

    def finish_workflow(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        output: str | None,
        error: str | None,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> None:
        self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries)
        self._q(
            "finish_workflow",
            status=status,
            output=output,
            error=error,
            now=now,
            workflow_id=workflow_id,
            epoch=epoch,
        )

    # --- executors ---------------------------------------------------------------------

    def register_executor(self, info: journal.ExecutorInfo) -> None:
        self._q(
            "register_executor",
            executor_id=info.executor_id,
            host=info.host,
            pid=info.pid,
            pid_start=info.pid_start,
            started_at=info.started_at,
            heartbeat_at=info.heartbeat_at,
        )

    def heartbeat(self, executor_id: str, now: float, lease_expires_at: float) -> None:
        self._q("renew_leases", owner=executor_id, lease_expires_at=lease_expires_at)
        self._q("heartbeat_executor", executor_id=executor_id, now=now)

    def list_executors(self) -> list[journal.ExecutorInfo]:
        rows = self._q("list_executors").fetchall()
        return [
            journal.ExecutorInfo(
                str(r[0]), str(r[1]), int(r[2]), str(r[3]), float(r[4]), float(r[5])
            )
            for r in rows
        ]

    def remove_executor(self, executor_id: str, expire_leases: bool) -> None:
        if expire_leases:
            self._q("expire_leases", owner=executor_id)
        self._q("remove_executor", executor_id=executor_id)


def _workflow(row: Sequence[Any]) -> journal.WorkflowInfo:
    return journal.WorkflowInfo(**dict(zip(_WORKFLOW_FIELDS, row, strict=True)))
