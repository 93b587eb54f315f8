"""The Store verbs written once in SQL; dialects supply only what truly differs.

Queries come from ``queries.sql`` and migrations from ``migrations/``; a dialect
subclass provides the connection, how a transaction begins, how parameters are
spelled, how tables are listed and how driver errors map to durably's errors.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.resources
import json
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
    """The statements of a migration file (no semicolons inside statements).

    Comment lines go first, so a semicolon in a comment splits nothing.
    """
    code = "\n".join(ln for ln in sql.splitlines() if not ln.strip().startswith("--"))
    for statement in code.split(";"):
        if statement.strip():
            yield statement.strip("\n")


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

    def _lock_migrations(self) -> None:
        """Make concurrent migrators wait for each other, inside the migration's transaction.

        Nothing to do where ``_begin(write=True)`` already takes the database's
        write lock (SQLite's BEGIN IMMEDIATE).
        """

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
        try:
            for op in ops:
                self._execute("SAVEPOINT op")
                try:
                    op.result = op.fn(*op.args)
                except Exception as exc:
                    self._execute("ROLLBACK TO SAVEPOINT op")
                    op.error = self._translate(exc)
                self._execute("RELEASE SAVEPOINT op")
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
            self._lock_migrations()
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

    def _fence(self, workflow_id: str, epoch: int, now: float) -> bool:
        """Check the epoch still owns the workflow (locking its row); return cancel_requested."""
        rows = self._q("fence", workflow_id=workflow_id, epoch=epoch, now=now).fetchall()
        if rows:
            return bool(rows[0][0])
        row = self._q("owner_of", workflow_id=workflow_id).fetchone()
        if row is None:
            raise errors.WorkflowNotFound(f"no workflow {workflow_id!r} in {self.url}")
        raise errors.FencedError(
            f"workflow {workflow_id!r} is now at epoch {row[1]} (owner {row[0]}, "
            f"status {row[2]}); this executor held epoch {epoch} and must stop"
        )

    def _upsert(self, workflow_id: str, entries: Sequence[journal.Entry], now: float) -> None:
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
            if e.kind == journal.Kind.EVENT and e.payload is not None:
                self._q(
                    "publish_event",
                    workflow_id=workflow_id,
                    key=e.name,
                    value=e.payload,
                    seq=e.seq,
                    now=now,
                )

    def append_entries(
        self, workflow_id: str, epoch: int, entries: Sequence[journal.Entry], now: float
    ) -> bool:
        cancel = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now)
        return cancel

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
        self._upsert(workflow_id, entries, now)
        self._q(
            "finish_workflow",
            status=status,
            output=output,
            error=error,
            now=now,
            workflow_id=workflow_id,
            epoch=epoch,
        )
        self._q("wake_parent", workflow_id=workflow_id, now=now)

    # --- waiting ------------------------------------------------------------------------

    def park(
        self,
        workflow_id: str,
        epoch: int,
        status: str,
        wake_at: float | None,
        entries: Sequence[journal.Entry],
        signals: Sequence[str],
        children: Sequence[str],
        now: float,
    ) -> bool:
        self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now)
        for name in signals:
            if self._q("next_signal", workflow_id=workflow_id, name=name).fetchone():
                return False
        for child_id in children:
            child = self.get_workflow(child_id)
            if child is None or child.finished:
                return False
        self._q(
            "park", status=status, wake_at=wake_at, now=now, workflow_id=workflow_id, epoch=epoch
        )
        return True

    def next_wake(self) -> float | None:
        row = self._q("next_wake").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def receive_signal(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        self._fence(workflow_id, epoch, now)
        found = self._q("next_signal", workflow_id=workflow_id, name=wait.name).fetchone()
        if found is not None:
            self._q("consume_signal", workflow_id=workflow_id, num=found[0], seq=wait.seq)
            final = dataclasses.replace(
                wait, status=journal.EntryStatus.COMPLETED, payload=found[1], finished_at=now
            )
        elif wait.wake_at is not None and now >= wait.wake_at:
            final = dataclasses.replace(wait, status=journal.EntryStatus.TIMED_OUT, finished_at=now)
        else:
            final = wait
        self._upsert(workflow_id, [*entries, final], now)
        return final

    def send_signal(
        self, workflow_id: str, name: str, payload: str, idempotency_key: str | None, now: float
    ) -> bool:
        if idempotency_key is not None:
            dup = self._q(
                "signal_by_key", workflow_id=workflow_id, idempotency_key=idempotency_key
            ).fetchone()
            if dup is not None:
                return False
        rows = self._q("count_signal", workflow_id=workflow_id, now=now).fetchall()
        if not rows:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        self._q(
            "insert_signal",
            workflow_id=workflow_id,
            num=int(rows[0][0]),
            name=name,
            payload=payload,
            idempotency_key=idempotency_key,
            now=now,
        )
        return True

    def get_event(self, workflow_id: str, key: str) -> str | None:
        row = self._q("get_event", workflow_id=workflow_id, key=key).fetchone()
        return None if row is None else str(row[0])

    def start_child(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        child: base.NewWorkflow,
        now: float,
    ) -> journal.WorkflowInfo:
        self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now)
        self._q(
            "create_child",
            workflow_id=child.workflow_id,
            name=child.name,
            version=child.version,
            source_hash=child.source_hash,
            input=child.input,
            parent_id=workflow_id,
            now=now,
        )
        row = self.get_workflow(child.workflow_id)
        assert row is not None
        return row

    def join_child(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        self._fence(workflow_id, epoch, now)
        child = self.get_workflow(wait.name)
        if child is not None and child.finished:
            outcome = {"status": child.status, "output": child.output, "error": child.error}
            final = dataclasses.replace(
                wait,
                status=journal.EntryStatus.COMPLETED,
                payload=json.dumps(outcome, separators=(",", ":")),
                finished_at=now,
            )
        else:
            final = wait
        self._upsert(workflow_id, [*entries, final], now)
        return final

    # --- operator verbs -----------------------------------------------------------------

    def request_cancel(self, workflow_id: str, now: float) -> list[str]:
        if self.get_workflow(workflow_id) is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        cancelled: list[str] = []
        todo = [workflow_id]
        while todo:
            wid = todo.pop()
            if self._q("request_cancel", workflow_id=wid, now=now).rowcount == 1:
                cancelled.append(wid)
            todo.extend(str(r[0]) for r in self._q("unfinished_children", workflow_id=wid))
        return cancelled

    def reopen(self, workflow_id: str, now: float) -> journal.WorkflowInfo:
        info = self.get_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        if info.status not in (
            journal.Status.FAILED,
            journal.Status.CANCELLED,
            journal.Status.DIVERGED,
        ):
            raise errors.DurablyError(
                f"workflow {workflow_id!r} is {info.status}; only a failed, cancelled or "
                "diverged workflow can be resumed"
            )
        history = self.load_history(workflow_id)
        cancels = [e.seq for e in history if e.kind == journal.Kind.CANCEL]
        if cancels:  # continue from where the cancellation stopped it
            self._q("delete_entries_from", workflow_id=workflow_id, seq=min(cancels))
        elif info.status == journal.Status.FAILED:
            failed = [
                e.seq
                for e in history
                if e.kind == journal.Kind.STEP and e.status == journal.EntryStatus.FAILED
            ]
            if failed:  # give the step that failed the workflow another try
                self._q("retry_entry", workflow_id=workflow_id, seq=max(failed), now=now)
        self._q("reopen", workflow_id=workflow_id, now=now)
        reopened = self.get_workflow(workflow_id)
        assert reopened is not None
        return reopened

    def fork(
        self, workflow_id: str, from_seq: int, new_id: str, now: float
    ) -> journal.WorkflowInfo:
        info = self.get_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        new = base.NewWorkflow(new_id, info.name, info.input, info.version, info.source_hash)
        forked, created = self.create_workflow(new, None, None, now)
        if not created:
            raise errors.WorkflowIdConflict(f"workflow id {new_id!r} is already taken")
        self._q("copy_entries", new_id=new_id, workflow_id=workflow_id, seq=from_seq)
        return forked

    def open_review(
        self,
        workflow_id: str,
        epoch: int,
        intent: journal.Entry,
        idempotency_key: str,
        reason: str,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> None:
        self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now)
        self._q(
            "open_review",
            workflow_id=workflow_id,
            seq=intent.seq,
            attempt=intent.attempt,
            step=intent.name,
            idempotency_key=idempotency_key,
            intent=intent.payload,
            reason=reason,
            now=now,
        )

    def reviews(self, workflow_id: str | None) -> list[journal.Review]:
        rows = self._q("open_reviews", workflow_id=workflow_id).fetchall()
        return [journal.Review(*r) for r in rows]

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        decision: str,
        outcome: str | None,
        decided_by: str,
        now: float,
    ) -> journal.Review:
        info = self.get_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        open_ = [r for r in self.reviews(workflow_id) if r.seq == seq]
        if info.status != journal.Status.NEEDS_REVIEW or not open_:
            raise errors.NothingToResolve(
                f"workflow {workflow_id!r} ({info.status}) has no step awaiting a decision "
                f"at seq {seq}; it may have been decided already"
            )
        review = open_[0]
        status = {
            "result": journal.EntryStatus.COMPLETED,
            "retry": journal.EntryStatus.RETRYING,
            "fail": journal.EntryStatus.FAILED,
        }[decision]
        entry = journal.Entry(
            seq,
            journal.Kind.STEP,
            review.step,
            status,
            review.attempt,
            outcome if decision != "retry" else review.intent,
            review.opened_at,
            now,
            now if decision == "retry" else None,
        )
        self._upsert(workflow_id, [entry], now)
        self._q(
            "decide_review",
            workflow_id=workflow_id,
            seq=seq,
            decision=decision,
            outcome=outcome,
            decided_by=decided_by,
            now=now,
        )
        self._q("review_decided", workflow_id=workflow_id, now=now)
        return dataclasses.replace(
            review, decision=decision, outcome=outcome, decided_by=decided_by, decided_at=now
        )

    def list_signals(self, workflow_id: str) -> list[dict[str, Any]]:
        rows = self._q("list_signals", workflow_id=workflow_id).fetchall()
        keys = ("num", "name", "payload", "idempotency_key", "sent_at", "consumed_seq")
        return [dict(zip(keys, r, strict=True)) for r in rows]

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
