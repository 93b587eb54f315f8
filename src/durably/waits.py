"""Waiting without a process: durable timers, signals, events and child workflows.

Each call takes a seq like a step. A wait that cannot be satisfied at once is
journaled (a timer as its absolute wake-up time), and once nothing else in the
workflow is running the workflow *parks*: its row says ``sleeping`` or
``waiting`` and when to wake, its task ends, and no thread, task or connection
is held for it. When the time comes, a signal arrives or a child finishes, any
engine on the database claims it and replays it to this point.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal

from durably import (
    codec,
    context,
    errors,
    journal,
    queues,
    races,
    telemetry,
    validate,
    workflows,
)
from durably.storage import base

if TYPE_CHECKING:
    from durably.workflow_run import Run

_STARTED = journal.EntryStatus.STARTED
_COMPLETED = journal.EntryStatus.COMPLETED


def _seconds(duration: float | datetime.timedelta, what: str) -> float:
    seconds = duration.total_seconds() if isinstance(duration, datetime.timedelta) else duration
    return validate.number(seconds, what)


def sleep(duration: float | datetime.timedelta) -> Coroutine[Any, Any, None]:
    """Wait ``duration`` (seconds or a timedelta) durably: a restart waits only what is left."""
    run = context.require_run("sleep")
    seconds = _seconds(duration, "sleep(duration)")
    return _sleep(run, run.take_seq(kind=journal.Kind.SLEEP), lambda now: now + seconds)


def sleep_until(when: datetime.datetime) -> Coroutine[Any, Any, None]:
    """Wait until ``when`` (an aware datetime; naive means UTC) durably."""
    run = context.require_run("sleep_until")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    at = when.timestamp()
    return _sleep(run, run.take_seq(kind=journal.Kind.SLEEP), lambda now: at)


@races.durable_call
async def _sleep(run: Run, seq: int, wake: Callable[[float], float]) -> None:
    entry = run.lookup(seq, journal.Kind.SLEEP, "")
    if entry is not None and entry.status == _COMPLETED:
        return
    clock = run.clock
    pokes = run.pokes  # a wake-up from here on (a cancel asked during the commit) re-checks
    if entry is None:
        now = clock()
        entry = journal.Entry(seq, journal.Kind.SLEEP, "", _STARTED, 1, None, now, None, wake(now))
        await run.commit(entry)
    wake_at = entry.wake_at or 0.0
    while clock() < wake_at:
        await run.block(journal.Kind.SLEEP, "", wake_at, pokes)
        pokes = run.pokes
        run.cancel_point(seq, journal.Kind.SLEEP, "")
    run.stage(dataclasses.replace(entry, status=_COMPLETED, finished_at=clock()))
    telemetry.wait_ended(run.workflow_id, seq, entry.kind, "", entry.started_at, "elapsed")


def wait_for_signal(
    name: str, timeout: float | datetime.timedelta | None = None
) -> Coroutine[Any, Any, Any]:
    """Wait for the next signal called ``name``; its payload, or None after ``timeout``.

    Signals sent before the wait are kept; each is delivered to exactly one
    wait, in the order sent. While it waits the workflow holds nothing.
    """
    run = context.require_run("wait_for_signal")
    validate.name(name, "signal name")
    seconds = None if timeout is None else _seconds(timeout, "wait_for_signal(timeout)")
    return _wait_for_signal(run, run.take_seq(kind=journal.Kind.SIGNAL, name=name), name, seconds)


@races.receives
async def _wait_for_signal(run: Run, seq: int, name: str, timeout: float | None) -> Any:
    entry = run.lookup(seq, journal.Kind.SIGNAL, name)
    if entry is None:
        now = run.clock()
        deadline = None if timeout is None else now + timeout
        entry = journal.Entry(
            seq, journal.Kind.SIGNAL, name, _STARTED, 1, None, now, None, deadline
        )
    entry = await _until_final(run, entry, "receive_signal")
    if entry.status == journal.EntryStatus.TIMED_OUT:
        return None
    return codec.decode(entry.payload or "null", where=f"signal {name!r} payload")


def set_event(key: str, value: Any) -> None:
    """Publish ``value`` under ``key`` for outsiders (``get_event``).

    In workflow code it is committed with the workflow's next durable call or
    its end. In a step's body it is published with the step's receipt, in the
    same transaction, so exactly once: an attempt that fails (or is cut by a
    crash) publishes nothing, and a step replayed from its receipt does not run.
    """
    step = context.current_step.get()
    if step is not None and context.current_run.get() is not None:
        validate.name(key, "event key")
        step.events.append((key, codec.encode(value, where=f"event {key!r} set in a step")))
        return
    run = context.require_run("set_event")
    validate.name(key, "event key")
    seq = run.take_seq(kind=journal.Kind.EVENT, name=key)
    if run.lookup(seq, journal.Kind.EVENT, key) is not None:
        return
    now = run.clock()
    payload = codec.encode(value, where=f"event {key!r}")
    run.stage(journal.Entry(seq, journal.Kind.EVENT, key, _COMPLETED, 1, payload, now, now))


@dataclasses.dataclass(frozen=True, slots=True)
class ChildHandle:
    """A child workflow started from a workflow; ``await handle.result()`` joins it."""

    workflow_id: str

    def result(self) -> Coroutine[Any, Any, Any]:
        """Wait durably for the child; its result, or raise its error in the parent."""
        run = context.require_run("ChildHandle.result")
        seq = run.take_seq(kind=journal.Kind.JOIN, name=self.workflow_id)
        return _join(run, seq, self.workflow_id)


def start_child(
    wf: Any,
    *args: Any,
    workflow_id: str | None = None,
    queue: queues.Queue | str | None = None,
    partition_key: str | None = None,
    **kwargs: Any,
) -> Coroutine[Any, Any, ChildHandle]:
    """Start a child workflow; its id is ``"<parent id>:<seq>"`` unless given.

    ``queue`` (a ``durably.Queue`` or its name) puts the child on that queue:
    it waits its turn within the queue's limits, on an engine serving it,
    while the parent awaits it as usual (``partition_key``: its partition, on
    a partitioned queue). It is journaled like any child, so a replay of the
    parent never starts it again.
    """
    run = context.require_run("start_child")
    definition = workflows.definition_of(wf)
    queue_name = _queue_name(queue, partition_key)
    seq = run.take_seq(kind=journal.Kind.CHILD, name=definition.name)
    return _start_child(run, seq, definition, args, kwargs, workflow_id, queue_name, partition_key)


def _queue_name(queue: queues.Queue | str | None, partition_key: str | None) -> str | None:
    """The name of the child's queue, its partition key checked against the queue where this
    process defines it (as ``enqueue`` checks it)."""
    if queue is None:
        if partition_key is not None:
            raise errors.QueueOptionError("start_child(partition_key=...) needs a queue=")
        return None
    name = validate.name(
        queue if isinstance(queue, str) else getattr(queue, "name", queue), "queue"
    )
    if not name:
        raise errors.InvalidName("start_child(queue=...): a queue name must be non-empty")
    defined = queue if isinstance(queue, queues.Queue) else queues.Queue.named(name)
    if defined is not None:
        defined.check_partition_key(partition_key)
    elif partition_key is not None:
        validate.name(partition_key, "partition_key")
    return name


async def _start_child(
    run: Run,
    seq: int,
    definition: workflows.WorkflowDefinition,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    workflow_id: str | None,
    queue: str | None = None,
    partition_key: str | None = None,
) -> ChildHandle:
    entry = run.lookup(seq, journal.Kind.CHILD, definition.name)
    if entry is not None:
        return ChildHandle(str(codec.decode(entry.payload or '""', where="child id")))
    child_id = (
        f"{run.workflow_id}:{seq}"
        if workflow_id is None
        else workflows.new_workflow_id(workflow_id)
    )
    workflows.check_arguments(definition, args, kwargs)
    payload = codec.encode(
        {"args": list(args), "kwargs": kwargs}, where=f"child workflow {definition.name!r} input"
    )
    new = base.NewWorkflow(
        child_id,
        definition.name,
        payload,
        definition.version,
        definition.source_hash,
        queue=queue,
        partition_key=partition_key,
        timeout=definition.timeout,  # its deadline is no later than its parent's (the store's)
    )
    now = run.clock()
    started = journal.Entry(
        seq, journal.Kind.CHILD, definition.name, _COMPLETED, 1, json.dumps(child_id), now, now
    )
    info: journal.WorkflowInfo = await run.write("start_child", new, entries=[started])
    if info.name != definition.name:
        raise errors.WorkflowIdConflict(
            f"child id {child_id!r} already names a {info.name!r} workflow, not {definition.name!r}"
        )
    run.child_started(child_id)
    return ChildHandle(child_id)


@races.durable_call
async def _join(run: Run, seq: int, child_id: str) -> Any:
    entry = run.lookup(seq, journal.Kind.JOIN, child_id)
    if entry is None:
        now = run.clock()
        entry = journal.Entry(seq, journal.Kind.JOIN, child_id, _STARTED, 1, None, now)
    entry = await _until_final(run, entry, "join_child")
    outcome = codec.decode(entry.payload or "{}", where=f"outcome of child {child_id!r}")
    if not isinstance(outcome, dict):
        raise errors.DecodeError(f"outcome of child {child_id!r} is not an object")
    return finished_outcome(
        f"child workflow {child_id!r}",
        outcome.get("status"),
        outcome.get("output"),
        outcome.get("error"),
    )


def finished_outcome(where: str, status: str | None, output: str | None, error: str | None) -> Any:
    """A finished workflow's result, or raise its recorded error (the original type if possible)."""
    if status == journal.Status.COMPLETED:
        return codec.decode(output or "null", where=f"{where} output")
    if status == journal.Status.CANCELLED:
        superseded = _superseded(error)
        if superseded:
            raise superseded
        recorded = codec.decode(error, where=f"{where} error") if error else None
        if isinstance(recorded, dict):
            cancelled = codec.decode_error(recorded)  # its message names a deadline, if passed
            if isinstance(cancelled, errors.Cancelled):
                raise cancelled
        raise errors.Cancelled(f"{where} was cancelled")
    data = codec.decode(error or "{}", where=f"{where} error")
    if isinstance(data, dict):
        raise codec.decode_error(data)
    raise errors.WorkflowFailed(f"{where} ended {status}")


def _superseded(error: str | None) -> errors.Superseded | None:
    """The Superseded a debounced enqueue recorded as its end (see Queue.enqueue), if so."""
    if not error or "durably.errors.Superseded" not in error:
        return None  # a cancel's own record is not read: the plain Cancelled says it all
    data = codec.decode(error, where="cancelled workflow's error")
    exc = codec.decode_error(data) if isinstance(data, dict) else None
    return exc if isinstance(exc, errors.Superseded) else None


async def _until_final(
    run: Run, entry: journal.Entry, receive: Literal["receive_signal", "join_child"]
) -> journal.Entry:
    """Ask the store (``receive_signal`` or ``join_child``) until the wait is final.

    Between asks the branch blocks until a poke, its deadline, or the run parks.
    A wait that turns final here emits its span (one already final emits none).
    """
    received = entry.seq == run.received_at_claim  # ended in the claim that launched us
    waited = entry.status == _STARTED or received
    while entry.status == _STARTED:
        pokes = run.pokes  # a wake-up from here on, even before the block, re-checks
        entry = await run.write(receive, entry)
        if entry.status == _STARTED:
            await run.block(entry.kind, entry.name, entry.wake_at, pokes)
            run.cancel_point(entry.seq, entry.kind, entry.name)
    if waited:
        telemetry.wait_ended(
            run.workflow_id,
            entry.seq,
            entry.kind,
            entry.name,
            entry.started_at,
            entry.status,
            entry.finished_at if received else None,
        )
    return entry
