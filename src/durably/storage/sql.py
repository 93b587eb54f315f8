"""The Store verbs written once in SQL; dialects supply only what truly differs.

Every verb runs inside the transaction :meth:`SqlBase.run_batch` opened, with
queries from ``queries.sql``; the dialect hooks it relies on are declared in
:mod:`durably.storage.sqlbase`. A verb that makes something claimable, delivers
a signal or frees a place in a queue says so with ``_wake``, which a dialect
with notifications sends when the transaction commits.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durably import cancellation, codec, errors, journal, replay
from durably.storage import base, bulk, cancels


@dataclasses.dataclass(slots=True)
class Fence:
    """What the fence found on the workflow's row: the write may go on at this epoch.

    ``crash_count`` is the crashes in a row a recovery left counted; the first new
    final entry written under this fence resets them (and zeroes this field).
    """

    workflow_id: str
    epoch: int
    cancel_requested: bool
    crash_count: int
    deadline_at: float | None = None

    def asked(self, now: float) -> bool:
        """True when the workflow must stop: cancel was requested or its deadline passed."""
        return cancellation.asked(self.cancel_requested, self.deadline_at, now)


class SqlStore(cancels.CancelVerbs, bulk.BulkVerbs):
    """The verbs of a Store in SQL; subclasses are dialects."""

    # --- workflows -------------------------------------------------------------------

    def create_workflow(
        self, new: base.NewWorkflow, owner: str | None, lease_expires_at: float | None, now: float
    ) -> tuple[journal.WorkflowInfo, bool]:
        if new.debounce_key is not None and new.queue is not None:
            self._lock_queue(new.queue, now)  # debounced enqueues of a queue take turns
        created = self._insert_workflow(new, owner, lease_expires_at, now)
        if created and new.debounce_key is not None:
            self._supersede(new, now)
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
        elif created and new.delay > 0:
            self._wake("timer", at=now + new.delay)
        elif created:
            self._wake("work")
        row = self.get_workflow(new.workflow_id)
        if row is None and new.queue is not None and new.deduplication_id is not None:
            found = self._q(
                "deduplicated", queue=new.queue, deduplication_id=new.deduplication_id
            ).fetchone()
            row = self.get_workflow(str(found[0])) if found else None
        if row is None:
            raise errors.StoreError(
                f"workflow {new.workflow_id!r} was neither created nor found in {self.url}"
            )
        return row, created

    def _insert_workflow(
        self,
        new: base.NewWorkflow,
        owner: str | None,
        lease_expires_at: float | None,
        now: float,
        inherited_deadline: float | None = None,
    ) -> bool:
        """Insert the workflow's row (owned by ``owner``, else pending); False if it exists.

        Its deadline is ``new.timeout`` from now, no later than ``inherited_deadline``
        (a child's: its parent's).
        """
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
            queue=new.queue,
            priority=new.priority,
            deduplication_id=new.deduplication_id,
            started_at=now if owner else None,
            max_recoveries=new.max_recoveries,
            wake_at=now + new.delay if new.delay > 0 and not owner else None,
            partition_key=new.partition_key,
            debounce_key=new.debounce_key,
            deadline_at=cancellation.deadline_of(new.timeout, now, inherited_deadline),
        )
        return bool(cursor.rowcount == 1)

    def _supersede(self, new: base.NewWorkflow, now: float) -> None:
        """End the not yet started workflows of ``new``'s queue and debounce key."""
        exc = errors.Superseded(
            f"superseded by workflow {new.workflow_id!r}, enqueued later on queue "
            f"{new.queue!r} with debounce key {new.debounce_key!r}; it never ran"
        )
        self._q(
            "supersede_debounced",
            error=json.dumps(codec.encode_error(exc)),
            now=now,
            queue=new.queue,
            debounce_key=new.debounce_key,
            workflow_id=new.workflow_id,
        )

    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        row = _one(self._q("get_workflow", workflow_id=workflow_id))
        return _workflow(row) if row else None

    def _lock_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        """The workflow's row, locked until the transaction ends where the dialect needs a
        row lock (``lock_row``); a rival deciding on the same workflow waits for it."""
        sql_text = self._queries["get_workflow"] + self.lock_row
        row = _one(self._execute(sql_text, {"workflow_id": workflow_id}))
        return _workflow(row) if row else None

    def list_workflows(
        self, status: str | None, name: str | None, limit: int
    ) -> list[journal.WorkflowInfo]:
        rows = _all(self._q("list_workflows", status=status, name=name, limit=limit))
        return [_workflow(r) for r in rows]

    def search_workflows(self, query: base.WorkflowQuery) -> list[journal.WorkflowInfo]:
        after_created, after_id = query.after if query.after is not None else (None, None)
        params = {
            "status": query.status,
            "name": query.name,
            "queue": query.queue,
            "parent_id": query.parent_id,
            "id_prefix": query.id_prefix,
            "created_after": query.created_after,
            "created_before": query.created_before,
            "after_created": after_created,
            "after_id": after_id,
            "workflow_id": None,
            "limit": query.limit,
            "offset": query.offset,
        }
        sql_name = "search_workflows_oldest_first" if query.order == "asc" else "search_workflows"
        if query.ids is None:
            return [_workflow(r) for r in _all(self._q(sql_name, **params))]
        # Given ids: one primary-key read each (a list parameter is not portable SQL), then
        # ordered and paged here; there are at most as many rows as ids.
        rows = [
            _workflow(r)
            for wid in dict.fromkeys(query.ids)
            for r in _all(self._q(sql_name, **{**params, "workflow_id": wid, "offset": 0}))
        ]
        rows.sort(key=lambda w: w.workflow_id)
        rows.sort(key=lambda w: w.created_at, reverse=query.order != "asc")
        return rows[query.offset : query.offset + query.limit]

    def count_by_status(self) -> dict[str, int]:
        return {str(status): int(n) for status, n in self._q("count_by_status").fetchall()}

    def claim_next(
        self,
        owner: str,
        runnable: Sequence[base.Runnable],
        lease_expires_at: float,
        now: float,
        limit: int,
        queues: Sequence[base.QueueLimits] = (),
        same_code: Mapping[str, str] | None = None,
    ) -> list[journal.WorkflowInfo]:
        if limit <= 0:
            return []
        self._q("create_runnable")
        self._q("clear_runnable")
        hashes = same_code or {}
        for name, version in sorted(set(runnable), key=lambda r: (r[0], r[1] or "")):
            self._q(
                "add_runnable", name=name, version=version or "", source_hash=hashes.get(name, "")
            )
        picked = self._pick("claimable_unqueued", now=now, limit=limit)
        claimed = [self._take(c, owner, lease_expires_at, now) for c in picked]
        # In name order, so that two claimers of the same queues never wait for each other
        # in a cycle.
        for queue in sorted(queues, key=lambda q: q.name):
            room, starts = self._room(queue, owner, now)
            room = min(room, limit - len(claimed))
            if room <= 0:
                continue
            if queue.partitioned and queue.concurrency is not None:
                # the concurrency holds per partition key: the query leaves each its place
                picked = self._pick(
                    "claimable_partitioned",
                    queue=queue.name,
                    now=now,
                    limit=room,
                    concurrency=queue.concurrency,
                )
            else:
                picked = self._pick("claimable_queued", queue=queue.name, now=now, limit=room)
            for *candidate, started_at in picked:
                if started_at is None:  # a first claim: a start, within the rate limit
                    if starts <= 0:
                        continue
                    starts -= 1
                claimed.append(self._take(candidate, owner, lease_expires_at, now))
        return claimed

    def _pick(self, query: str, /, **params: Any) -> list[Any]:
        """The claimable rows a query selects, locked against other claimers where they run."""
        return list(self._execute(self._queries[query] + self.skip_locked, params).fetchall())

    def _room(self, queue: base.QueueLimits, owner: str, now: float) -> tuple[int, int]:
        """How many more workflows of the queue this owner may run now, and how many
        of them may be starts (first claims) within the rate limit.

        Locks the queue's row first: its claimers count and claim one at a time.
        A partitioned queue's concurrency is left to the claim query (per key).
        """
        self._lock_queue(queue.name, now)
        since = now - queue.rate_per
        running, mine, started = self._q(
            "queue_load", queue=queue.name, owner=owner, now=now, since=since
        ).fetchone()
        room = starts = 1 << 30
        if queue.concurrency is not None and not queue.partitioned:
            room = min(room, queue.concurrency - int(running))
        if queue.worker_concurrency is not None:
            room = min(room, queue.worker_concurrency - int(mine))
        if queue.rate_limit is not None:
            starts = queue.rate_limit - int(started)
        return room, starts

    def _lock_queue(self, name: str, now: float) -> None:
        """Lock the queue's row (made the first time) until the transaction ends."""
        if self._q("lock_queue", queue=name, now=now).rowcount != 1:
            self._q("create_queue", queue=name, now=now)
            self._q("lock_queue", queue=name, now=now)

    def _take(
        self, candidate: Sequence[Any], owner: str, lease_expires_at: float, now: float
    ) -> journal.WorkflowInfo:
        """Claim one selected row (still locked by this transaction); record why."""
        workflow_id, status, previous_owner, epoch = candidate
        crashed = previous_owner is not None and status == journal.Status.RUNNING
        cursor = self._q(
            "claim",
            owner=owner,
            lease_expires_at=lease_expires_at,
            crashed=1 if crashed else 0,
            now=now,
            workflow_id=workflow_id,
            epoch=epoch,
        )
        if cursor.rowcount != 1:  # only if a dialect let another claimer take a selected row
            raise errors.StoreError(f"workflow {workflow_id!r} changed hands while being claimed")
        reason = "recovery" if crashed else ("resume" if epoch else "start")
        self._q(
            "insert_claim",
            workflow_id=workflow_id,
            epoch=int(epoch) + 1,
            owner=owner,
            now=now,
            previous_owner=previous_owner,
            reason=reason,
        )
        row = self.get_workflow(workflow_id)
        assert row is not None
        return row

    def unclaimed(self, now: float, limit: int) -> list[base.Unclaimed]:
        rows = self._q("unclaimed", now=now, limit=limit).fetchall()
        return [base.Unclaimed(str(r[0]), str(r[1]), r[2], r[3], r[4]) for r in rows]

    def load_claims(self, workflow_id: str) -> list[journal.Claim]:
        return [journal.Claim(**r) for r in _all(self._q("load_claims", workflow_id=workflow_id))]

    def release(self, workflow_id: str, epoch: int, now: float, crashed: bool = False) -> None:
        query = "release_crashed" if crashed else "release_one"
        if self._q(query, workflow_id=workflow_id, epoch=epoch, now=now).rowcount:
            self._wake("work")

    def release_owned(self, owner: str, now: float) -> int:
        released = int(self._q("release_owned", owner=owner, now=now).rowcount)
        if released:
            self._wake("work")
        return released

    # --- journal ---------------------------------------------------------------------

    def load_history(self, workflow_id: str) -> list[journal.Entry]:
        return [_entry(r) for r in _all(self._q("load_history", workflow_id=workflow_id))]

    def _fence(self, workflow_id: str, epoch: int, now: float) -> Fence:
        """Check the epoch still owns the workflow (locking its row); return what it found.

        A plain SELECT (``FOR UPDATE`` where the dialect needs a row lock), so a
        step's commit writes no workflow page. A parked or finished workflow has
        no owner, so nothing more is written to it at that epoch. When a
        recovery left crashes counted, the first new final entry resets them
        (see ``_upsert``): intents, parks and pending waits are not progress.
        """
        sql_text = self._queries["fence"] + self.lock_row
        # Read by position, on every commit: the fence's own two columns, in this order.
        found = self._execute(sql_text, {"workflow_id": workflow_id, "epoch": epoch}).fetchone()
        if found is not None:
            cancel_requested, crash_count, deadline_at = found
            return Fence(workflow_id, epoch, bool(cancel_requested), int(crash_count), deadline_at)
        row = _one(self._q("owner_of", workflow_id=workflow_id))
        if row is None:
            raise errors.WorkflowNotFound(f"no workflow {workflow_id!r} in {self.url}")
        raise errors.FencedError(
            f"workflow {workflow_id!r} is now at epoch {row['epoch']} (owner {row['owner']}, "
            f"status {row['status']}); this executor held epoch {epoch} and must stop"
        )

    def _progressed(self, fence: Fence | None, now: float) -> None:
        """A new final entry was written under ``fence``: the crashes in a row end here."""
        if fence is not None and fence.crash_count:
            fence.crash_count = 0
            self._q("progress", workflow_id=fence.workflow_id, epoch=fence.epoch, now=now)

    def _upsert(
        self,
        workflow_id: str,
        entries: Sequence[journal.Entry],
        now: float,
        fence: Fence | None,
    ) -> None:
        """Write entries; under a ``fence``, the first new final one resets counted crashes."""
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
            if cursor.rowcount == 1 and e.status in journal.FINAL_ENTRY_STATUSES:
                self._progressed(fence, now)
            elif cursor.rowcount != 1 and not self._holds(workflow_id, e):
                raise errors.StoreError(
                    f"workflow {workflow_id!r} seq {e.seq} already holds a final or a "
                    f"different entry; refusing to overwrite it with {e.describe()}"
                )
            if e.kind == journal.Kind.CANCEL:  # a step awaiting review will not be decided
                self._q(
                    "decide_review",
                    workflow_id=workflow_id,
                    seq=e.seq,
                    decision="cancelled",
                    outcome=None,
                    decided_by="cancel",
                    now=now,
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

    def _entry_at(self, workflow_id: str, seq: int) -> journal.Entry | None:
        row = _one(self._q("entry_at", workflow_id=workflow_id, seq=seq))
        return None if row is None else _entry(row)

    def _holds(self, workflow_id: str, entry: journal.Entry) -> bool:
        """True if the journal already holds this very entry (a commit repeated because
        the first one's outcome was unknown, its connection lost at COMMIT)."""
        found = self._entry_at(workflow_id, entry.seq)
        return found is not None and (
            found.kind,
            found.name,
            found.status,
            found.attempt,
            found.payload,
        ) == (entry.kind, entry.name, entry.status, entry.attempt, entry.payload)

    def _final_at(self, workflow_id: str, seq: int) -> journal.Entry | None:
        found = self._entry_at(workflow_id, seq)
        return found if found is not None and found.status in journal.FINAL_ENTRY_STATUSES else None

    def append_entries(
        self, workflow_id: str, epoch: int, entries: Sequence[journal.Entry], now: float
    ) -> bool:
        fence = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now, fence)
        return fence.asked(now)

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
        fence = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now, fence)
        final = cancellation.final_status(status, fence.cancel_requested, fence.deadline_at, now)
        if final != status:  # it returned after the cancel was committed: cancelled, output kept
            status = final
            late = cancellation.cancelled(
                workflow_id, "after its last durable call", fence.deadline_at, now
            )
            error = codec.encode(codec.encode_error(late), where="workflow error")
        parent_id, queue = self._q(
            "finish_workflow",
            status=status,
            output=output,
            error=error,
            now=now,
            workflow_id=workflow_id,
            epoch=epoch,
        ).fetchone()
        if parent_id is not None:
            self._q("wake_parent", parent_id=parent_id, now=now)
            self._wake("join", str(parent_id), name=workflow_id)
        if queue is not None:
            self._wake("work")  # a place in its queue is free

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
        fence = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now, fence)
        for name in signals:
            if self._q("next_signal", workflow_id=workflow_id, name=name).fetchone():
                return False
        for child_id in children:
            child = self.get_workflow(child_id)
            if child is None or child.finished:
                return False
        if fence.asked(now) and not self._q("cancel_delivered", workflow_id=workflow_id).fetchone():
            wake_at = now  # asked to stop meanwhile: due at once, so a claim delivers it
        (queue,) = self._q(
            "park", status=status, wake_at=wake_at, now=now, workflow_id=workflow_id, epoch=epoch
        ).fetchone()
        if wake_at is not None:
            self._wake("timer", at=wake_at)
        if queue is not None:
            self._wake("work")  # a place in its queue is free
        return True

    def next_wake(self) -> float | None:
        row = self._q("next_wake").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _settle_wait(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
        outcome: Callable[[], journal.Entry],
    ) -> journal.Entry:
        """The shared shape of receive_signal and join_child: fenced, idempotent.

        A wait already final (its first commit's outcome was unknown to the
        caller) is returned as it is; otherwise ``outcome()`` decides what to write.
        """
        fence = self._fence(workflow_id, epoch, now)
        done = self._final_at(workflow_id, wait.seq)
        if done is not None:
            self._upsert(workflow_id, entries, now, fence)
            return done
        final = outcome()
        self._upsert(workflow_id, [*entries, final], now, fence)
        return final

    def receive_signal(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            found = self._q("next_signal", workflow_id=workflow_id, name=wait.name).fetchone()
            if found is not None:
                self._q("consume_signal", workflow_id=workflow_id, num=found[0], seq=wait.seq)
            return replay.signal_outcome(wait, None if found is None else found[1], now)

        return self._settle_wait(workflow_id, epoch, wait, entries, now, outcome)

    def send_signal(
        self, workflow_id: str, name: str, payload: str, idempotency_key: str | None, now: float
    ) -> bool:
        # Under the workflow's row lock, so of two senders of one key the second sees the
        # first's signal; ON CONFLICT in insert_signal is the backstop.
        target = self._lock_workflow(workflow_id)
        if target is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        if idempotency_key is not None:
            dup = self._q(
                "signal_by_key", workflow_id=workflow_id, idempotency_key=idempotency_key
            ).fetchone()
            if dup is not None:
                return False
        if target.finished:
            raise errors.WorkflowFinished(
                f"workflow {workflow_id!r} is {target.status}: signal {name!r} could never be "
                "received, so it was not kept"
            )
        rows = self._q("count_signal", workflow_id=workflow_id, now=now).fetchall()
        inserted = self._q(
            "insert_signal",
            workflow_id=workflow_id,
            num=int(rows[0][0]),
            name=name,
            payload=payload,
            idempotency_key=idempotency_key,
            now=now,
        )
        if inserted.rowcount != 1:
            return False
        self._wake("signal", workflow_id, name=name)
        return True

    def get_event(self, workflow_id: str, key: str) -> str | None:
        row = self._q("get_event", workflow_id=workflow_id, key=key).fetchone()
        return None if row is None else str(row[0])

    def post_signal(
        self,
        workflow_id: str,
        epoch: int,
        send: journal.Entry,
        entries: Sequence[journal.Entry],
        target: str,
        name: str,
        payload: str,
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            key = f"{workflow_id}:{send.seq}"
            try:
                self.send_signal(target, name, payload, key, now)
            except (errors.WorkflowNotFound, errors.WorkflowFinished) as exc:
                error = {"type": f"durably.errors.{type(exc).__name__}", "message": str(exc)}
                return replay.sent_outcome(send, json.dumps(error), now)
            return replay.sent_outcome(send, None, now)

        return self._settle_wait(workflow_id, epoch, send, entries, now, outcome)

    def read_event(
        self,
        workflow_id: str,
        epoch: int,
        wait: journal.Entry,
        entries: Sequence[journal.Entry],
        source: str,
        key: str,
        now: float,
    ) -> journal.Entry:
        def outcome() -> journal.Entry:
            return replay.signal_outcome(wait, self.get_event(source, key), now)

        return self._settle_wait(workflow_id, epoch, wait, entries, now, outcome)

    def commit_receipt(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        events: Sequence[tuple[str, str]],
        now: float,
    ) -> bool:
        requested = self.append_entries(workflow_id, epoch, entries, now)
        seq = entries[-1].seq
        for key, value in events:
            self._q(
                "publish_event", workflow_id=workflow_id, key=key, value=value, seq=seq, now=now
            )
        return requested

    def start_child(
        self,
        workflow_id: str,
        epoch: int,
        entries: Sequence[journal.Entry],
        child: base.NewWorkflow,
        now: float,
    ) -> journal.WorkflowInfo:
        fence = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now, fence)
        child = dataclasses.replace(child, parent_id=workflow_id)
        self._insert_workflow(child, None, None, now, inherited_deadline=fence.deadline_at)
        self._wake("work")
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
        def outcome() -> journal.Entry:
            return replay.join_outcome(wait, self.get_workflow(wait.name), now)

        return self._settle_wait(workflow_id, epoch, wait, entries, now, outcome)

    # --- operator verbs -----------------------------------------------------------------

    def reopen(self, workflow_id: str, now: float) -> journal.WorkflowInfo:
        info = self._lock_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        if info.status == journal.Status.PENDING and info.queue is not None:
            self._q("dequeue", workflow_id=workflow_id, now=now)  # not started: start it now
            self._wake("work")
            started = self.get_workflow(workflow_id)
            assert started is not None
            return started
        edit = replay.plan_reopen(workflow_id, info.status, self.load_history(workflow_id))
        if edit.delete_from is not None:
            self._q("delete_entries_from", workflow_id=workflow_id, seq=edit.delete_from)
        if edit.retry_seq is not None:
            self._q("retry_entry", workflow_id=workflow_id, seq=edit.retry_seq, now=now)
        self._q("reopen", workflow_id=workflow_id, now=now)
        self._wake("work")
        reopened = self.get_workflow(workflow_id)
        assert reopened is not None
        return reopened

    def fork(
        self, workflow_id: str, from_seq: int, new_id: str, now: float
    ) -> journal.WorkflowInfo:
        info = self.get_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        new = base.NewWorkflow(
            new_id,
            info.name,
            info.input,
            info.version,
            info.source_hash,
            max_recoveries=info.max_recoveries,
        )
        forked, created = self.create_workflow(new, None, None, now)
        if not created:
            raise errors.WorkflowIdConflict(f"workflow id {new_id!r} is already taken")
        self._q("copy_entries", new_id=new_id, workflow_id=workflow_id, seq=from_seq)
        self._q("copy_events", new_id=new_id, workflow_id=workflow_id, seq=from_seq, now=now)
        self._q("mark_fork", new_id=new_id, workflow_id=workflow_id, seq=from_seq)
        self._wake("work")
        return dataclasses.replace(forked, forked_from=workflow_id, forked_from_seq=from_seq)

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
        fence = self._fence(workflow_id, epoch, now)
        self._upsert(workflow_id, entries, now, fence)
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
        return [journal.Review(**r) for r in _all(self._q("open_reviews", workflow_id=workflow_id))]

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        decision: str,
        outcome: str | None,
        decided_by: str,
        now: float,
    ) -> journal.Review:
        # Decided under the workflow's row lock (SQLite: the write lock of BEGIN IMMEDIATE):
        # a rival resolver waits here, then finds the review decided.
        info = self._lock_workflow(workflow_id)
        if info is None:
            raise errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {self.url}")
        open_ = [r for r in self.reviews(workflow_id) if r.seq == seq]
        if info.status != journal.Status.NEEDS_REVIEW or not open_:
            raise self._nothing_to_resolve(workflow_id, seq, info.status)
        review = open_[0]
        entry = replay.resolved_entry(review, decision, outcome, now)
        decided = self._q(
            "decide_review",
            workflow_id=workflow_id,
            seq=seq,
            decision=decision,
            outcome=outcome,
            decided_by=decided_by,
            now=now,
        )
        if decided.rowcount != 1:  # only if a dialect let a rival in past the row lock
            raise self._nothing_to_resolve(workflow_id, seq, info.status)
        # Unfenced (a person decides, no run holds the workflow): resets no crash count.
        self._upsert(workflow_id, [entry], now, None)
        self._q("review_decided", workflow_id=workflow_id, now=now)
        self._wake("work")
        return dataclasses.replace(
            review, decision=decision, outcome=outcome, decided_by=decided_by, decided_at=now
        )

    def _nothing_to_resolve(self, workflow_id: str, seq: int, status: str) -> errors.DurablyError:
        """Why there is nothing to decide at ``seq``: who decided it, if anyone did."""
        row = self._q("review_at", workflow_id=workflow_id, seq=seq).fetchone()
        if row is not None:
            decision, by, at = row
            when = datetime.datetime.fromtimestamp(float(at), datetime.UTC).isoformat(
                timespec="seconds"
            )
            return errors.AlreadyResolved(
                f"workflow {workflow_id!r} has no step awaiting a decision at seq {seq}: it "
                f"was decided already ({decision} by {by!r} at {when})"
            )
        return errors.NothingToResolve(
            f"workflow {workflow_id!r} ({status}) has no step awaiting a decision at seq {seq}"
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
            serves=json.dumps(
                {"workflows": [list(w) for w in info.workflows], "queues": list(info.queues)},
                separators=(",", ":"),
            ),
        )

    def heartbeat(
        self, executor: journal.ExecutorInfo, now: float, lease_expires_at: float
    ) -> list[tuple[str, int]]:
        held = self._q(
            "renew_leases", owner=executor.executor_id, lease_expires_at=lease_expires_at
        ).fetchall()
        self.register_executor(dataclasses.replace(executor, heartbeat_at=now))
        return [(str(r[0]), int(r[1])) for r in held]

    def keep_leases(
        self,
        executor: journal.ExecutorInfo,
        now: float,
        lease_expires_at: float,
        held: Sequence[tuple[str, int]],
    ) -> list[str]:
        kept = []
        for workflow_id, epoch in held:
            cursor = self._q(
                "keep_lease",
                workflow_id=workflow_id,
                owner=executor.executor_id,
                epoch=epoch,
                lease_expires_at=lease_expires_at,
            )
            if cursor.rowcount:
                kept.append(workflow_id)
        self.register_executor(dataclasses.replace(executor, heartbeat_at=now))
        return kept

    def list_executors(self) -> list[journal.ExecutorInfo]:
        out = []
        for row in _all(self._q("list_executors")):
            workflows, queues = _serves(row.pop("serves"))
            out.append(journal.ExecutorInfo(**row, workflows=workflows, queues=queues))
        return out

    def remove_executor(self, executor_id: str, expire_leases: bool) -> None:
        if expire_leases:
            self._q("expire_leases", owner=executor_id)
        self._q("remove_executor", executor_id=executor_id)


def _serves(
    text: str | None,
) -> tuple[tuple[tuple[str, str | None, str | None], ...], tuple[str, ...]]:
    """The workflows and queues an executor registered as served (none if unreadable:
    an executor of an older durably, which did not say)."""
    try:
        data = json.loads(text or "{}")
        workflows = tuple((str(n), v, h) for n, v, h in data.get("workflows", ()))
        return workflows, tuple(str(q) for q in data.get("queues", ()))
    except (ValueError, TypeError, AttributeError):
        return (), ()


# --- rows to objects, by column name ----------------------------------------------------
# A query's columns are named as the fields of the object they become, so a reordered
# or added column cannot shift a value into the wrong field (an unknown one is a TypeError).


def _names(cursor: Any) -> list[str]:
    return [str(column[0]).lower() for column in cursor.description]


def _one(cursor: Any) -> dict[str, Any] | None:
    """The cursor's next row by column name, or None."""
    row = cursor.fetchone()
    return None if row is None else dict(zip(_names(cursor), row, strict=True))


def _all(cursor: Any) -> list[dict[str, Any]]:
    """The cursor's remaining rows by column name."""
    rows = cursor.fetchall()
    if not rows:
        return []
    names = _names(cursor)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _workflow(row: dict[str, Any]) -> journal.WorkflowInfo:
    return journal.WorkflowInfo(**row)


def _entry(row: dict[str, Any]) -> journal.Entry:
    row["seq"], row["attempt"] = int(row["seq"]), int(row["attempt"])
    return journal.Entry(**row)
