"""Workflow rows and who runs them: create, read, search, claim, release, executors.

The verbs that decide which executor holds a workflow at which epoch (the
claim bumps it, so the previous holder's writes are fenced off) and the
executors' heartbeats that keep those leases. Part of
:class:`~durably.storage.sql.SqlStore`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from durably import cancellation, codec, errors, journal, validate
from durably.storage import base, bulk, marks, rows, sqlbase

#: The filters written, beside a list of ids, on an expression no index serves
#: (search_terms' *_listed terms), so that the ids are read through the primary key.
_LISTED = frozenset({"status", "queue", "parent_id"})

#: A search by id prefix reads the prefix's range of the primary key when it holds fewer
#: ids than ID_RANGE_CAP, or than ID_RANGE_PER_ROW times the page's end, whichever is
#: more (``ClaimVerbs._id_range``).
ID_RANGE_CAP = 500
ID_RANGE_PER_ROW = 10


def _count_capped() -> str:
    """count_status_capped for every status (our own constants), joined with UNION ALL."""
    term = sqlbase.load_queries()["count_status_capped"]
    return "\nUNION ALL\n".join(term.replace("{status}", s.value) for s in journal.Status)


def _same_start(row: journal.WorkflowInfo, owner: str, now: float) -> bool:
    """True if ``row`` is what a start by ``owner`` at ``now`` created (not yet claimed again)."""
    return (row.owner, row.epoch, row.created_at) == (owner, 1, now)


def workflow_params(
    new: base.NewWorkflow,
    owner: str | None,
    lease_expires_at: float | None,
    now: float,
    inherited_deadline: float | None = None,
) -> dict[str, Any]:
    """The parameters of a new workflow's row (``create_workflow`` and the statements that
    embed it): owned by ``owner`` (running), else pending."""
    status = journal.Status.RUNNING if owner else journal.Status.PENDING
    return {
        "workflow_id": new.workflow_id,
        "name": new.name,
        "version": new.version,
        "source_hash": new.source_hash,
        "status": status.value,
        "input": new.input,
        "owner": owner,
        "epoch": 1 if owner else 0,
        "lease_expires_at": lease_expires_at,
        "parent_id": new.parent_id,
        "now": now,
        "queue": new.queue,
        "priority": new.priority,
        "deduplication_id": new.deduplication_id,
        "started_at": now if owner else None,
        "max_recoveries": new.max_recoveries,
        "wake_at": now + new.delay if new.delay > 0 and not owner else None,
        "partition_key": new.partition_key,
        "debounce_key": new.debounce_key,
        "deadline_at": cancellation.deadline_of(new.timeout, now, inherited_deadline),
    }


class ClaimVerbs(bulk.BulkVerbs):
    """Workflow rows, claims and executors, for :class:`~durably.storage.sql.SqlStore`."""

    def create_workflow(
        self, new: base.NewWorkflow, owner: str | None, lease_expires_at: float | None, now: float
    ) -> tuple[journal.WorkflowInfo, bool]:
        if new.debounce_key is not None and new.queue is not None:
            self._lock_queue(new.queue, now)  # debounced enqueues of a queue take turns
        # superseding a debounced burst writes after the row: then it is not the whole verb
        row = self._create_row(new, owner, lease_expires_at, now, whole=new.debounce_key is None)
        created = row is not None
        if created and new.debounce_key is not None:
            self._supersede(new, now)
        if created and not owner:  # pending: an executor takes it (started here: running)
            if new.delay > 0:
                self._wake("timer", at=now + new.delay)
            else:
                self._wake("work")
        if row is None:  # it was there already (or its deduplication id was)
            row = self.get_workflow(new.workflow_id)
            # ... or it is this very start, sent again: a statement sent as its own
            # transaction commits before its answer, and its connection may be lost between
            created = row is not None and owner is not None and _same_start(row, owner, now)
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

    def _create_row(
        self,
        new: base.NewWorkflow,
        owner: str | None,
        lease_expires_at: float | None,
        now: float,
        *,
        whole: bool,
    ) -> journal.WorkflowInfo | None:
        """The new workflow's row and, owned (started here), its start's claim; None if it
        exists. ``whole``: nothing else of the verb writes after them. PostgreSQL writes
        both in one statement (``create_owned_workflow``)."""
        row = self._insert_workflow(new, owner, lease_expires_at, now)
        if row is not None and owner:
            self._q(
                "insert_claim",
                workflow_id=new.workflow_id,
                epoch=1,
                owner=owner,
                now=now,
                previous_owner=None,
                reason="start",
            )
        return row

    def _insert_workflow(
        self,
        new: base.NewWorkflow,
        owner: str | None,
        lease_expires_at: float | None,
        now: float,
        inherited_deadline: float | None = None,
        *,
        query: str = "create_workflow",
    ) -> journal.WorkflowInfo | None:
        """Insert the workflow's row (owned by ``owner``, else pending) and return it; None
        if it exists. ``query``: create_workflow, or a statement that embeds it.

        Its deadline is ``new.timeout`` from now, no later than ``inherited_deadline``
        (a child's: its parent's).
        """
        params = workflow_params(new, owner, lease_expires_at, now, inherited_deadline)
        found = rows.first(self._q(query, **params))
        return rows.workflow(found) if found else None

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

    @marks.one_read
    def get_workflow(self, workflow_id: str) -> journal.WorkflowInfo | None:
        row = rows.first(self._q("get_workflow", workflow_id=workflow_id))
        return rows.workflow(row) if row else None

    @marks.one_read
    def list_workflows(
        self, status: str | None, name: str | None, limit: int
    ) -> list[journal.WorkflowInfo]:
        return self.search_workflows(base.WorkflowQuery(status=status, name=name, limit=limit))

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
            "limit": query.limit,
            "offset": query.offset,
        }
        if query.ids is None:
            if query.id_prefix:
                params.update(self._id_range(query.id_prefix, query.limit + query.offset))
            return [rows.workflow(r) for r in rows.every(self._search(query.order, params))]
        # Given ids: one statement per IDS_PER_STATEMENT of them (each read through the
        # primary key), then ordered and paged here; there are at most as many rows as ids.
        found: list[journal.WorkflowInfo] = []
        for slots, named in sqlbase.id_chunks(list(dict.fromkeys(query.ids))):
            chunk_params = {**params, **named, "limit": slots, "offset": 0}
            # in the query's order: its cursor term looks past ``after`` that way
            chunk_rows = rows.every(self._search(query.order, chunk_params))
            found += [rows.workflow(r) for r in chunk_rows]
        found.sort(key=lambda w: w.workflow_id)
        found.sort(key=lambda w: w.created_at, reverse=query.order != "asc")
        return found[query.offset : query.offset + query.limit]

    def _select_locked(self, query: base.WorkflowQuery) -> list[str]:
        """The ids of every workflow ``query`` selects (every page of it, in its order) as
        they are now, for a verb deciding on them in this transaction.

        The rows read are locked (in id order, where the dialect needs row locks) and
        read again under the lock, so a workflow changed meanwhile is chosen only if it
        still matches; a rival deciding on one of them waits for this transaction.
        """
        found: list[str] = []
        page_query = query
        while True:
            page = self.search_workflows(page_query)
            found += [w.workflow_id for w in page]
            if len(page) < page_query.limit:
                break
            last = page[-1]
            page_query = dataclasses.replace(
                page_query, after=(last.created_at, last.workflow_id), offset=0
            )
        if not found:
            return []
        if self.lock_row:
            self._each_listed("lock_listed", sorted(found), suffix=self.lock_row)
        again = dataclasses.replace(query, ids=tuple(found), limit=len(found), offset=0)
        return [w.workflow_id for w in self.search_workflows(again)]

    @marks.alone
    def delete_selected(self, query: base.WorkflowQuery, force: bool) -> list[str]:
        """``delete_workflows`` of what ``query`` selects as it goes (``_select_locked``),
        in this one transaction; the ids removed. A workflow resumed or changed meanwhile
        is deleted only if it still matches (``force`` skips the status check, not the
        filters)."""
        still = self._select_locked(query)
        return self.delete_workflows(still, force) if still else []

    def _id_range(self, prefix: str, wanted: int) -> dict[str, str]:
        """The range parameters (``id_from``, ``id_below``) of a search by id ``prefix``
        that few workflows match, else none.

        Few: fewer ids in the range than ``ID_RANGE_CAP`` (or ``ID_RANGE_PER_ROW``
        times ``wanted``, the page's end), counted off the primary key's index.
        Those are read through it and sorted, where the search scanned workflows
        newest first until the page was full: every workflow when none matched.
        Many are left to that scan, which then fills the page soon; the range would
        sort them all.
        """
        below = sqlbase.prefix_end(prefix)
        if not self.ids_in_code_point_order or below is None:
            return {}
        # the largest LIMIT either database takes, for a page far past the end
        cap = min(max(ID_RANGE_CAP, ID_RANGE_PER_ROW * wanted), validate.BIGINT[1])
        found = self._q("count_id_range", id_from=prefix, id_below=below, cap=cap).fetchone()
        if found is None or int(found[0]) >= cap:
            return {}
        return {"id_from": prefix, "id_below": below}

    def _search(self, order: str, params: Mapping[str, Any]) -> Any:
        """Run search_workflows with the terms of the filters ``params`` gives (not None;
        ``ids_N`` parameters are the ``ids`` filter)."""
        ids = sum(1 for name in params if name.startswith("ids_"))
        given = frozenset(
            k for k, v in params.items() if v is not None and not k.startswith("ids_")
        )
        if ids:  # read through the primary key, the other indexed filters checked on each row
            indexed = given & _LISTED
            given = given - indexed | {f"{name}_listed" for name in indexed} | {"ids"}
        newest = order != "asc"

        def compose() -> str:
            raw = sqlbase.load_queries()
            return sqlbase.search_sql(
                raw["search_workflows" if newest else "search_workflows_oldest_first"],
                raw["search_terms" if newest else "search_terms_oldest_first"],
                given,
                ids,
            )

        return self._execute(self._composed(("search", newest, given, ids), compose), params)

    @marks.one_read
    def count_by_status(self, cap: int | None = None) -> dict[str, int]:
        if cap is None:
            return {str(status): int(n) for status, n in self._q("count_by_status").fetchall()}
        sql_text = self._composed(("count_by_status_capped",), _count_capped)
        found = self._execute(sql_text, {"cap": cap}).fetchall()
        return {str(status): int(n) for status, n in found if n}

    @marks.one_read
    def count_unfinished(self) -> dict[str, int]:
        return {str(status): int(n) for status, n in self._q("count_unfinished").fetchall()}

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
        self._fill_runnable(runnable_rows(runnable, same_code))
        claimed = self._claim_unqueued(owner, lease_expires_at, now, limit)
        # In name order, so that two claimers of the same queues never wait for each other
        # in a cycle.
        for queue in sorted(queues, key=lambda q: q.name):
            room, starts = self._room(queue, owner, now)
            if room < limit - len(claimed) or queue.partitioned:
                # The limits bind (or may, per key): the workflows asked to stop, which hold no
                # place, are taken first and whatever the room (a parked one waits for none).
                asked = self._pick(
                    "claimable_cancelled", queue=queue.name, now=now, limit=limit - len(claimed)
                )
                claimed += [self._take(c, owner, lease_expires_at, now) for c in asked]
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

    def claim_woken(
        self,
        owner: str,
        workflow_id: str,
        runnable: Sequence[base.Runnable],
        lease_expires_at: float,
        now: float,
        same_code: Mapping[str, str] | None = None,
    ) -> journal.WorkflowInfo | None:
        self._fill_runnable(runnable_rows(runnable, same_code))
        return self._claim_woken(owner, workflow_id, lease_expires_at, now)

    def _claim_woken(
        self, owner: str, workflow_id: str, lease_expires_at: float, now: float
    ) -> journal.WorkflowInfo | None:
        """The pick of one row by id, then its take; PostgreSQL sends one statement
        (``claim_woken``)."""
        picked = self._pick("claimable_woken", workflow_id=workflow_id, now=now)
        return self._take(picked[0], owner, lease_expires_at, now) if picked else None

    def _fill_runnable(self, wanted: tuple[tuple[str, str, str], ...]) -> None:
        """Make the connection's ``runnable_here`` hold ``wanted`` (name, version, source
        hash), the claim queries' join. Nothing is sent when it holds them already: a
        recovery pass, with the same workflows registered as the last, writes nothing."""
        temp = self._temp_tables()
        if temp.runnable == wanted:
            return
        temp.forget()  # in doubt until written
        self._q("create_runnable")
        self._q("clear_runnable")
        for name, version, source_hash in wanted:
            self._q("add_runnable", name=name, version=version, source_hash=source_hash)
        self._temp_tables().runnable = wanted  # the connection's now (it may be a new one)

    def _carry_temp_tables(self, lost: sqlbase.TempTables) -> None:
        """Write on this thread's new connection what ``lost`` (its connection's, found
        dead by a batch's first statement) held, so that the statement, which may rely
        on it, can be sent again as it was. Committed at once: the batch has not begun."""
        if lost.runnable is not None:
            self._fill_runnable(lost.runnable)

    def _claim_unqueued(
        self, owner: str, lease_expires_at: float, now: float, limit: int
    ) -> list[journal.WorkflowInfo]:
        """Pick and take up to ``limit`` claimable workflows of no queue, oldest first.
        The pick, then a take per row (``_take``); PostgreSQL does it all in one statement
        (``claim_unqueued``)."""
        picked = self._pick("claimable_unqueued", now=now, limit=limit)
        return [self._take(c, owner, lease_expires_at, now) for c in picked]

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
        row = self._claim_and_record(
            workflow_id=workflow_id,
            epoch=int(epoch),
            owner=owner,
            lease_expires_at=lease_expires_at,
            now=now,
            previous_owner=previous_owner,
            reason="recovery" if crashed else ("resume" if epoch else "start"),
        )
        if row is None:  # only if a dialect let another claimer take a selected row
            raise changed_hands(workflow_id)
        return row

    def _claim_and_record(self, **params: Any) -> journal.WorkflowInfo | None:
        """Claim the row at ``epoch`` (the ``claim`` query counts a recovery's crash),
        record the claim, and return the row; None if the row was not at that epoch.
        Three statements; PostgreSQL sends one (``claim_and_record``)."""
        if self._q("claim", **params).rowcount != 1:
            return None
        self._q("insert_claim", **{**params, "epoch": params["epoch"] + 1})
        return self.get_workflow(params["workflow_id"])

    @marks.one_read
    def unclaimed(self, now: float, limit: int) -> list[base.Unclaimed]:
        found = self._q("unclaimed", now=now, limit=limit).fetchall()
        return [base.Unclaimed(str(r[0]), str(r[1]), r[2], r[3], r[4]) for r in found]

    @marks.one_read
    def load_claims(self, workflow_id: str) -> list[journal.Claim]:
        return [
            journal.Claim(**r) for r in rows.every(self._q("load_claims", workflow_id=workflow_id))
        ]

    def release(self, workflow_id: str, epoch: int, now: float, crashed: bool = False) -> None:
        query = "release_crashed" if crashed else "release_one"
        if self._q(query, workflow_id=workflow_id, epoch=epoch, now=now).rowcount:
            self._wake("work")

    @marks.alone
    def release_owned(self, owner: str, now: float) -> int:
        released = int(self._q("release_owned", owner=owner, now=now).rowcount)
        if released:
            self._wake("work")
        return released

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

    @marks.alone
    def heartbeat(
        self, executor: journal.ExecutorInfo, now: float, lease_expires_at: float
    ) -> list[tuple[str, int]]:
        held = self._q(
            "renew_leases", owner=executor.executor_id, lease_expires_at=lease_expires_at
        ).fetchall()
        self.register_executor(dataclasses.replace(executor, heartbeat_at=now))
        return [(str(r[0]), int(r[1])) for r in held]

    @marks.alone
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

    @marks.one_read
    def list_executors(self) -> list[journal.ExecutorInfo]:
        out = []
        for row in rows.every(self._q("list_executors")):
            workflows, queues = _serves(row.pop("serves"))
            out.append(journal.ExecutorInfo(**row, workflows=workflows, queues=queues))
        return out

    @marks.alone
    def remove_executor(self, executor_id: str, expire_leases: bool) -> None:
        if expire_leases:
            self._q("expire_leases", owner=executor_id)
        self._q("remove_executor", executor_id=executor_id)


def runnable_rows(
    runnable: Sequence[base.Runnable], same_code: Mapping[str, str] | None
) -> tuple[tuple[str, str, str], ...]:
    """The rows of ``runnable_here`` for these (name, version) pairs: name, version ('' for
    none) and the source hash a strict executor requires ('' for any)."""
    hashes = same_code or {}
    return tuple(sorted({(n, v or "", hashes.get(n, "")) for n, v in runnable}))


def taken(found: list[dict[str, Any]]) -> list[journal.WorkflowInfo]:
    """The rows a statement that picks and claims returned (``claim_unqueued``): each with
    the id it was picked as, and no row where the row picked changed hands."""
    for row in found:
        picked_id = row.pop("picked_id")
        if row["workflow_id"] is None:  # only if a dialect let another claimer take it
            raise changed_hands(picked_id)
    return [rows.workflow(row) for row in found]


def changed_hands(workflow_id: str) -> errors.StoreError:
    """The error of a claim whose selected row another claimer took meanwhile."""
    return errors.StoreError(f"workflow {workflow_id!r} changed hands while being claimed")


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
