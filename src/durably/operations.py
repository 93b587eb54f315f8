"""The operator calls of Client and Engine, written once.

Starting, reading, signalling, cancelling, resuming, forking and resolving
validate and encode the same way whether a synchronous :class:`~durably.Client`
or an async :class:`~durably.Engine` makes them. Each is written here once, as
a *plan*: a generator that yields the store verbs to run (:class:`Call`) and,
for a polling wait, the pauses between reads (:class:`Pause`), and returns the
answer. :func:`run_sync` runs a plan for the Client; :func:`run_async` for the
Engine, whose pauses end early when the engine learns of a change
(:class:`ChangeBroadcast`). What only an executor does after a call (run what it
started, wake its own runs) stays in the Engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, TypeVar

from durably import cancellation, codec, errors, journal, replay, step_call, validate, workflows
from durably.storage import base, marks, thread

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """Run a store verb; the plan is sent its result (its error propagates)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    write: bool = False
    #: Called with the result once the verb has run, even if an async caller is cancelled
    #: meanwhile (``StoreThread.call``): what must follow the commit, whoever waits for it.
    then: Callable[[Any], None] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """Wait up to ``seconds`` before the next read (an engine may end it sooner)."""

    seconds: float


Plan = Generator[Call | Pause, Any, T]


def delays(first: float, factor: float, cap: float) -> Iterator[float]:
    """The back-off of a polling wait: ``first``, growing by ``factor`` up to ``cap``."""
    delay = first
    while True:
        yield delay
        delay = min(delay * factor, cap)


def not_found(workflow_id: str, where: str) -> errors.WorkflowNotFound:
    """The error for an id that names no workflow in the database ``where``."""
    return errors.WorkflowNotFound(f"no workflow with id {workflow_id!r} in {where}")


def check_name(found: journal.WorkflowInfo, name: str) -> None:
    """Raise WorkflowIdConflict if the row holding the id is another workflow."""
    if found.name != name:
        raise errors.WorkflowIdConflict(
            f"workflow id {found.workflow_id!r} already names a {found.name!r} workflow, "
            f"not {name!r}"
        )


def new_workflow(
    wf: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    workflow_id: str | None,
    max_recoveries: int | None = None,
    timeout: float | datetime.timedelta | None = None,
    delay: float = 0.0,
) -> tuple[base.NewWorkflow, workflows.WorkflowDefinition | None]:
    """What ``start`` commits, and the definition behind it if this process has one.

    ``wf`` is a decorated workflow or a workflow name; a name registered in no
    module of this process is committed as it is, for a worker that has it.
    ``max_recoveries`` and ``timeout`` (else the decorator's) are recorded with
    the workflow (the timeout as a deadline, counted from the commit); ``delay``
    (seconds, checked by the caller) as ``NewWorkflow.delay``.
    """
    if max_recoveries is not None:
        validate.count(max_recoveries, "max_recoveries", low=0)
    seconds = None if timeout is None else workflows.check_timeout(timeout, "timeout")
    definition: workflows.WorkflowDefinition | None = None
    if isinstance(wf, str) and workflows.registered(wf) is None:
        if not wf.strip():
            raise errors.InvalidName("a workflow name must be a non-empty string")
        validate.name(wf, "workflow name")
        name, version, source_hash = wf, None, None
    else:
        definition = workflows.definition_of(wf)
        name, version, source_hash = definition.name, definition.version, definition.source_hash
        workflows.check_arguments(definition, args, kwargs)
    wid = workflows.new_workflow_id(workflow_id)
    payload = codec.encode({"args": list(args), "kwargs": kwargs}, where=f"workflow {name!r} input")
    if max_recoveries is None and definition is not None:
        max_recoveries = definition.max_recoveries
    if seconds is None and definition is not None:
        seconds = definition.timeout
    new = base.NewWorkflow(
        wid, name, payload, version, source_hash, max_recoveries=max_recoveries, timeout=seconds,
        delay=delay,
    )  # fmt: skip
    return new, definition


def _workflow_id(workflow_id: object) -> None:
    """Refuse an id no workflow can have (a NUL, a lone surrogate) before the store sees it."""
    validate.name(workflow_id, "workflow id")


class Operations:
    """The plans of the operator calls on one store, stamped by one clock."""

    def __init__(self, store: base.Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    # --- reading ----------------------------------------------------------------------

    def get_workflow(self, workflow_id: str) -> Plan[journal.WorkflowInfo]:
        _workflow_id(workflow_id)
        info: journal.WorkflowInfo | None = yield Call(self.store.get_workflow, (workflow_id,))
        if info is None:
            raise not_found(workflow_id, self.store.url)
        return info

    def list_workflows(
        self, status: str | None, name: str | None, limit: int, **filters: Any
    ) -> Plan[list[journal.WorkflowInfo]]:
        """One page of workflows: ``status``, ``name`` and the filters of
        :func:`workflow_query` (ids, id prefix, parent, queue, time, offset, order, after)."""
        query = yield from self.workflow_query(status=status, name=name, limit=limit, **filters)
        rows: list[journal.WorkflowInfo] = yield from self.search_workflows(query)
        return rows

    def workflow_query(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        limit: int = 100,
        ids: Iterable[str] | None = None,
        id_prefix: str | None = None,
        parent_id: str | None = None,
        queue: str | None = None,
        created_after: float | datetime.datetime | None = None,
        created_before: float | datetime.datetime | None = None,
        offset: int = 0,
        order: str = "desc",
        after: str | tuple[float, str] | None = None,
    ) -> Plan[base.WorkflowQuery]:
        """The store query for these filters, each checked; ``after`` may be the id of
        the last row of the previous page (read here for its creation time)."""
        if status is not None:
            status = journal.Status(status).value  # ValueError names the valid ones
        for value, what in (
            (name, "workflow name"),
            (id_prefix, "id_prefix"),
            (parent_id, "parent_id"),
            (queue, "queue"),
        ):
            if value is not None:
                validate.name(value, what)
        chosen: tuple[str, ...] | None = None
        if ids is not None:
            if isinstance(ids, str):
                raise ValueError(f"ids must be a list of workflow ids, not the string {ids!r}")
            chosen = tuple(ids)
            for wid in chosen:
                _workflow_id(wid)
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a whole number of rows, 0 or more, not {offset!r}")
        cursor: tuple[float, str] | None = None
        if isinstance(after, str):
            last = yield from self.get_workflow(after)
            cursor = (last.created_at, last.workflow_id)
        elif after is not None:
            cursor = (validate.number(after[0], "after[0]", low=float("-inf")), str(after[1]))
        return base.WorkflowQuery(
            status=status,
            name=name,
            queue=queue,
            created_after=_epoch(created_after, "created_after"),
            created_before=_epoch(created_before, "created_before"),
            after=cursor,
            limit=limit,
            ids=chosen,
            id_prefix=id_prefix,
            parent_id=parent_id,
            offset=offset,
            order=order,
        )

    def search_workflows(self, query: base.WorkflowQuery) -> Plan[list[journal.WorkflowInfo]]:
        if query.status is not None:
            journal.Status(query.status)  # ValueError names the valid ones
        if query.limit < 1:
            raise ValueError(f"limit must be at least 1, not {query.limit}")
        rows: list[journal.WorkflowInfo] = yield Call(self.store.search_workflows, (query,))
        return rows

    def selection(self, filters: dict[str, Any]) -> Plan[base.WorkflowQuery]:
        """The query of a bulk call's filters, a page of BULK_PAGE oldest first.

        At least one filter: a bulk call on every workflow is refused, never guessed.
        """
        paging = sorted(set(filters) & {"limit", "offset", "order", "after"})
        if paging:
            raise ValueError(f"a bulk call acts on every workflow selected: no {paging[0]!r}")
        given = {k: v for k, v in filters.items() if v is not None}
        if not given:
            raise ValueError(
                "a bulk call needs at least one filter (status, name, queue, parent_id, "
                "id_prefix, ids, created_after, created_before)"
            )
        query: base.WorkflowQuery = yield from self.workflow_query(
            **given, order="asc", limit=BULK_PAGE
        )
        return query

    def count_by_status(self, cap: int | None = None) -> Plan[dict[str, int]]:
        if cap is not None:
            cap = validate.count(cap, "count_by_status(cap)", high=validate.BIGINT[1])
        counts: dict[str, int] = yield Call(self.store.count_by_status, (cap,))
        return counts

    def count_unfinished(self) -> Plan[dict[str, int]]:
        counts: dict[str, int] = yield Call(self.store.count_unfinished, ())
        return counts

    def history(self, workflow_id: str) -> Plan[list[journal.Entry]]:
        yield from self.get_workflow(workflow_id)
        entries: list[journal.Entry] = yield Call(self.store.load_history, (workflow_id,))
        return entries

    def history_page(
        self, workflow_id: str, after_seq: int | None, before_seq: int | None, limit: int
    ) -> Plan[list[journal.Entry]]:
        """One page of the journal in seq order (``Store.history_page``), its arguments
        checked first; WorkflowNotFound for an unknown id, as ``history``."""
        _workflow_id(workflow_id)
        size = validate.count(limit, "limit", high=validate.BIGINT[1])
        if after_seq is not None and before_seq is not None:
            raise ValueError(
                f"after_seq={after_seq!r} and before_seq={before_seq!r}: give one of them "
                "(a page after a seq, or before one), or neither (the newest page)"
            )
        for seq, what in ((after_seq, "after_seq"), (before_seq, "before_seq")):
            if seq is not None:
                validate.count(seq, what, low=validate.BIGINT[0], high=validate.BIGINT[1])
        yield from self.get_workflow(workflow_id)
        page: list[journal.Entry] = yield Call(
            self.store.history_page, (workflow_id, after_seq, before_seq, size)
        )
        return page

    def history_steps(self, workflow_id: str, name_prefix: str) -> Plan[list[journal.Entry]]:
        validate.name(name_prefix, "name_prefix")
        yield from self.get_workflow(workflow_id)
        steps: list[journal.Entry] = yield Call(
            self.store.history_steps, (workflow_id, name_prefix)
        )
        return steps

    def history_mark(self, workflow_id: str) -> Plan[journal.HistoryMark]:
        _workflow_id(workflow_id)
        mark: journal.HistoryMark = yield Call(self.store.history_mark, (workflow_id,))
        return mark

    def claims(self, workflow_id: str) -> Plan[list[journal.Claim]]:
        _workflow_id(workflow_id)
        claims: list[journal.Claim] = yield Call(self.store.load_claims, (workflow_id,))
        return claims

    def signals(self, workflow_id: str) -> Plan[list[dict[str, Any]]]:
        _workflow_id(workflow_id)
        signals: list[dict[str, Any]] = yield Call(self.store.list_signals, (workflow_id,))
        return signals

    def signals_page(
        self, workflow_id: str, before_num: int | None, limit: int
    ) -> Plan[list[dict[str, Any]]]:
        """One page of the signals in num order (``Store.signals_page``), its arguments
        checked first; WorkflowNotFound for an unknown id, as ``history_page``."""
        _workflow_id(workflow_id)
        size = validate.count(limit, "limit", high=validate.BIGINT[1])
        if before_num is not None:
            validate.count(
                before_num, "before_num", low=validate.BIGINT[0], high=validate.BIGINT[1]
            )
        yield from self.get_workflow(workflow_id)
        page: list[dict[str, Any]] = yield Call(
            self.store.signals_page, (workflow_id, before_num, size)
        )
        return page

    def executors(self) -> Plan[list[journal.ExecutorInfo]]:
        executors: list[journal.ExecutorInfo] = yield Call(self.store.list_executors, ())
        return executors

    def reviews(self, workflow_id: str | None) -> Plan[list[journal.Review]]:
        if workflow_id is not None:
            _workflow_id(workflow_id)
        reviews: list[journal.Review] = yield Call(self.store.reviews, (workflow_id,))
        return reviews

    def get_event(self, workflow_id: str, key: str, timeout: float | None) -> Plan[Any]:
        _workflow_id(workflow_id)
        validate.name(key, "event key")
        wait = 0.0 if timeout is None else validate.number(timeout, "get_event(timeout)")
        deadline = time.monotonic() + wait
        for delay in delays(0.01, 2.0, 0.25):
            value: str | None = yield Call(self.store.get_event, (workflow_id, key))
            if value is not None:
                return codec.decode(value, where=f"event {key!r} of {workflow_id!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                yield from self.get_workflow(workflow_id)  # WorkflowNotFound beats TimeoutError
                raise TimeoutError(f"workflow {workflow_id!r} has not published {key!r}")
            yield Pause(min(delay, left))
        raise AssertionError("unreachable: delays() never ends")

    def live_events(self, key: str, limit: int) -> Plan[list[tuple[str, str]]]:
        """``(workflow_id, value)`` of event ``key`` in the waiting and running workflows
        that published it (``Store.live_events``), each value as stored: its reader
        decodes each (``codec.decode``), so that one it cannot decode hides no other."""
        validate.name(key, "event key")
        limit = validate.count(limit, "limit")
        found: list[tuple[str, str]] = yield Call(self.store.live_events, (key, limit))
        return found

    # --- changing -----------------------------------------------------------------------

    def start(
        self,
        new: base.NewWorkflow,
        owner: str | None = None,
        lease_seconds: float = 0.0,
        then: Callable[[tuple[journal.WorkflowInfo, bool]], None] | None = None,
    ) -> Plan[tuple[journal.WorkflowInfo, bool]]:
        """Commit the workflow (owned by ``owner``, else pending); its row and whether new.
        ``then`` is called with both once committed, even if the caller is cancelled."""
        now = self.clock()
        lease_expires_at = now + lease_seconds if owner is not None else None
        found: tuple[journal.WorkflowInfo, bool] = yield Call(
            self.store.create_workflow, (new, owner, lease_expires_at, now), True, then
        )
        check_name(found[0], new.name)
        return found

    def send_signal(
        self, workflow_id: str, name: str, payload: Any, idempotency_key: str | None
    ) -> Plan[bool]:
        data = _signal_payload(workflow_id, name, payload, idempotency_key)
        args = (workflow_id, name, data, idempotency_key, self.clock())
        sent: bool = yield Call(self.store.send_signal, args, True)
        return sent

    def send_signal_and_claim(
        self,
        workflow_id: str,
        name: str,
        payload: Any,
        idempotency_key: str | None,
        claim: Claimer,
    ) -> Plan[Woken]:
        """``send_signal``, and in the same transaction the claim of the workflow it wakes
        (``claim_woken``) with its journal: the engine that sends a signal to a parked
        workflow it can run takes it in one commit, not three."""
        data = _signal_payload(workflow_id, name, payload, idempotency_key)
        args = (self.store, workflow_id, name, data, idempotency_key, self.clock(), claim)
        woken: Woken = yield Call(_send_and_claim, args, True)
        return woken

    def send_signals(self, signals: Any) -> Plan[list[bool]]:
        """Several signals in one transaction: each ``(workflow_id, name[, payload[,
        idempotency_key]])``; all are kept or none (an unknown or finished workflow)."""
        batch: list[tuple[str, str, str, str | None]] = []
        for i, given in enumerate(signals):
            where = f"send_signals: signals[{i}]"
            if not isinstance(given, tuple | list) or not 2 <= len(given) <= 4:
                raise ValueError(
                    f"{where} is {given!r}; each signal is (workflow_id, name[, payload[, "
                    "idempotency_key]])"
                )
            workflow_id, name, payload, key = (*given, None, None)[:4]
            validate.name(workflow_id, f"{where} workflow id")
            validate.name(name, f"{where} signal name")
            if key is not None:
                validate.name(key, f"{where} idempotency_key")
            data = codec.encode(payload, where=f"{where} payload")
            batch.append((workflow_id, name, data, key))
        sent: list[bool] = yield Call(self.store.send_signals, (batch, self.clock()), True)
        return sent

    def cancel(self, workflow_id: str) -> Plan[list[str]]:
        _workflow_id(workflow_id)
        asked: list[str] = yield Call(self.store.request_cancel, (workflow_id, self.clock()), True)
        return asked

    def cancel_many(self, filters: dict[str, Any]) -> Plan[list[str]]:
        """Ask every workflow the filters select (and their children) to stop, chosen and
        asked in one transaction (``Store.cancel_selected``); the ids asked (those already
        finished are left as they are)."""
        query = yield from self.selection(filters)
        asked: list[str] = yield Call(self.store.cancel_selected, (query, self.clock()), True)
        return asked

    def resume_many(self, filters: dict[str, Any]) -> Plan[list[str]]:
        """Resume every workflow the filters select, all or none, chosen and resumed in one
        transaction (``Store.resume_selected``); the ids.

        Each must be resumable (pending on a queue, failed, cancelled or diverged):
        filter by status to select only those.
        """
        query = yield from self.selection(filters)
        resumed: list[str] = yield Call(self.store.resume_selected, (query, self.clock()), True)
        return resumed

    def delete(self, workflow_ids: Iterable[str], force: bool) -> Plan[list[str]]:
        """Remove the workflows with their children and every row naming them (all or
        none); without ``force`` only finished ones."""
        chosen = list(workflow_ids)
        for wid in chosen:
            _workflow_id(wid)
        deleted: list[str] = yield Call(self.store.delete_workflows, (chosen, bool(force)), True)
        return deleted

    def delete_many(self, filters: dict[str, Any], force: bool) -> Plan[list[str]]:
        """Delete every workflow the filters select, as :meth:`delete` (all or none), chosen
        and deleted in one transaction (``Store.delete_selected``): never on a selection
        read earlier, which ``force`` would not check again."""
        query = yield from self.selection(filters)
        deleted: list[str] = yield Call(self.store.delete_selected, (query, bool(force)), True)
        return deleted

    def resume(self, workflow_id: str) -> Plan[journal.WorkflowInfo]:
        _workflow_id(workflow_id)
        info: journal.WorkflowInfo = yield Call(
            self.store.reopen, (workflow_id, self.clock()), True
        )
        return info

    def fork(self, workflow_id: str, from_seq: int, new_id: str | None) -> Plan[str]:
        """Copy the workflow under ``new_id`` (default: a fresh ``<id>-fork-<hex>``); the id."""
        _workflow_id(workflow_id)
        validate.count(from_seq, "from_seq", low=0, high=validate.BIGINT[1])
        fork_id = new_id or f"{workflow_id}-fork-{uuid.uuid4().hex[:8]}"
        _workflow_id(fork_id)
        yield Call(self.store.fork, (workflow_id, from_seq, fork_id, self.clock()), True)
        return fork_id

    def resolve(
        self,
        workflow_id: str,
        seq: int,
        result: Any,
        retry: bool,
        fail: str | None,
        by: str,
        attempt: int | None = None,
    ) -> Plan[journal.Review]:
        _workflow_id(workflow_id)
        validate.count(seq, "seq", low=0, high=validate.BIGINT[1])
        if attempt is not None:
            validate.count(attempt, "attempt", low=1, high=validate.BIGINT[1])
        validate.name(by, "by")
        decision, outcome = step_call.review_decision(result, retry, fail, by)
        args = (workflow_id, seq, decision, outcome, by, self.clock(), attempt)
        review: journal.Review = yield Call(self.store.resolve, args, True)
        return review


#: How many rows a bulk call's selection reads at a time.
BULK_PAGE = 500


def _signal_payload(workflow_id: str, name: str, payload: Any, idempotency_key: str | None) -> str:
    """A signal's names checked and its payload encoded, as every way of sending one does."""
    _workflow_id(workflow_id)
    validate.name(name, "signal name")
    if idempotency_key is not None:
        validate.name(idempotency_key, "idempotency_key")
    return codec.encode(payload, where=f"signal {name!r} payload")


@dataclasses.dataclass(frozen=True, slots=True)
class Claimer:
    """Who claims a woken workflow, and what it may take (``Store.claim_woken``'s)."""

    owner: str
    runnable: list[base.Runnable]
    lease_seconds: float
    same_code: dict[str, str]


#: What ``send_signal_and_claim`` and ``take_woken`` did (``base.Woken``).
Woken = base.Woken


def _claim_args(workflow_id: str, now: float, claim: Claimer) -> tuple[Any, ...]:
    """The arguments of ``claim_woken`` for ``claim``."""
    lease_expires_at = now + claim.lease_seconds
    return (claim.owner, workflow_id, claim.runnable, lease_expires_at, now, claim.same_code)


def _at_once_args(
    workflow_id: str, signal: tuple[str, str, str | None] | None, now: float, claim: Claimer
) -> tuple[Any, ...]:
    """The arguments of ``Store.take_at_once``, which does all of an op where it can."""
    lease_expires_at = now + claim.lease_seconds
    return (workflow_id, signal, now, claim.owner, claim.runnable, lease_expires_at,
            claim.same_code)  # fmt: skip


@marks.ends_with("receive_parked_signal")
def _send_and_claim(
    store: base.Store,
    workflow_id: str,
    name: str,
    data: str,
    idempotency_key: str | None,
    now: float,
    claim: Claimer,
) -> Woken:
    """One op, so one transaction: the signal, the claim of what it woke, its journal.

    Other executors are told of the signal only when this one did not take the workflow:
    told of one it took, each would try to claim it, fail, and look for work.
    """
    signal = (name, data, idempotency_key)
    at_once = store.take_at_once(*_at_once_args(workflow_id, signal, now, claim))
    if at_once is not None:  # all of it, one round trip (PostgreSQL)
        return at_once
    if not store.send_signal(workflow_id, name, data, idempotency_key, now, tell=False):
        return Woken(False)  # a duplicate: it woke nothing
    woken = _take_woken_verbs(store, workflow_id, now, claim)
    if woken.taken is None:
        store.tell_signal(workflow_id, name)
    return woken


@marks.ends_with("receive_parked_signal")
def take_woken(store: base.Store, workflow_id: str, now: float, claim: Claimer) -> Woken:
    """``claim_woken`` and, if it took the workflow, its journal: one op, one transaction.

    A workflow parked on nothing but a signal wait receives the signal here too
    (``receive_parked_signal`` at the new epoch), so its re-run replays the wait from
    the journal instead of committing it: one commit less on a signal's wake-up. It is
    the state a re-run that received the signal and then crashed would have left. The
    receive is the op's last call (``ends_with``): PostgreSQL sends it with COMMIT, or
    does all of it in one round trip (``Store.take_at_once``).
    """
    at_once = store.take_at_once(*_at_once_args(workflow_id, None, now, claim))
    if at_once is not None:
        return at_once
    return _take_woken_verbs(store, workflow_id, now, claim)


def _take_woken_verbs(store: base.Store, workflow_id: str, now: float, claim: Claimer) -> Woken:
    """``take_woken`` verb by verb."""
    taken = store.claim_woken(*_claim_args(workflow_id, now, claim))
    if taken is None:
        return Woken(True)
    history = store.load_history(workflow_id)
    wait = replay.parked_signal_wait(history)
    if wait is None or cancellation.asked(taken.cancel_requested, taken.deadline_at, now):
        return Woken(True, taken, history)
    final = store.receive_parked_signal(workflow_id, taken.epoch, wait, now)  # the last call
    if final.status == journal.EntryStatus.STARTED:  # nothing received here: the run will
        return Woken(True, taken, history)
    return Woken(True, taken, [*history[:-1], final], final)


def _epoch(when: float | datetime.datetime | None, what: str) -> float | None:
    """Epoch seconds from a number or a datetime (a naive one is local time)."""
    if when is None:
        return None
    if isinstance(when, datetime.datetime):
        return when.timestamp()
    return validate.number(when, what, low=float("-inf"))


# --- running a plan -----------------------------------------------------------------------


def run_sync(plan: Plan[T], store: thread.StoreThread) -> T:
    """Run the plan from synchronous code: verbs on the store thread, pauses as sleeps."""
    with contextlib.closing(plan):
        answer: Any = None
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(op, Pause):
                time.sleep(op.seconds)
                answer = None
            else:
                answer = store.call_sync(op.fn, *op.args, write=op.write)
                if op.then is not None:
                    op.then(answer)


async def run_async(
    plan: Plan[T], store: thread.StoreThread, changes: ChangeBroadcast, *, inline: bool = False
) -> T:
    """Run the plan on an event loop; a pause ends early on a change seen since the last read.

    With ``inline``, a call may run on the loop's thread (``StoreThread.call``): at once
    while nothing else is ready on the loop, or gathered with others at its next turn,
    as a run's commits do.
    """
    with contextlib.closing(plan):
        answer: Any = None
        mark = changes.mark()
        while True:
            try:
                op = plan.send(answer)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(op, Pause):
                await changes.wait(mark, op.seconds)
                answer = None
            else:
                mark = changes.mark()
                answer = await store.call(
                    op.fn, *op.args, write=op.write, inline=inline, then=op.then
                )


class ChangeBroadcast:
    """A broadcast: this engine learned that stored workflows may have changed.

    Set on every wake-up the store reports (PostgreSQL's LISTEN/NOTIFY), every
    kick of recovery and every local run that ends or parks. A waiter takes
    :meth:`mark` *before* it reads the store, then :meth:`wait` s on that mark:
    a change signalled in between is not lost. Waiters still poll, at their
    own back-off, for what nothing reports (SQLite, a finish on another host).
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def mark(self) -> asyncio.Event:
        """What to wait on for the changes after now."""
        return self._event

    def signal(self) -> None:
        """Wake every waiter."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    @staticmethod
    async def wait(mark: asyncio.Event, timeout: float) -> None:
        """Return after a change since ``mark`` was taken, or after ``timeout`` seconds."""
        await wait_event(mark, timeout)


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds pass.

    With asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
    cancellation that lands in the same loop iteration as the event (CPython
    gh-86296), and a loop waiting that way may never end.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
