"""Messages between workflows, from workflow code: ``send_signal`` and ``get_event``.

Both are durable calls: each takes a seq like a step, and its outcome is
journaled in the same transaction that carries it out, so a replay (after a
park or a crash) returns what the first run saw without touching the other
workflow again. A send is made exactly once: the signal and the journal entry
that records it commit together, and the signal's idempotency key
(``"<workflow id>:<seq>"``) stops a repeated commit from keeping it twice. A
read journals the value it found, so a replay returns that value even after
the other workflow published a newer one.

From a step's body, use ``durably.set_event`` (published with the step's
receipt); signals are sent from workflow code, where they can be journaled.
"""

from __future__ import annotations

import datetime
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from durably import codec, context, errors, faults, journal, races, validate

if TYPE_CHECKING:
    from durably.workflow_run import Run

_STARTED = journal.EntryStatus.STARTED

#: The shortest and the longest pause between two reads of an event not yet published.
#: In between, the pause is half the time waited so far (the start is journaled, so a
#: replay goes on where the wait was); a pause longer than the engine's ``hold_seconds``
#: parks the workflow until the next read.
_POLL = (0.01, 2.0)


def send_signal(workflow_id: str, name: str, payload: Any = None) -> Coroutine[Any, Any, None]:
    """Send signal ``name`` with ``payload`` to workflow ``workflow_id``, exactly once.

    Await it. The signal is committed together with this workflow's journal
    entry for the send: a replay, or a recovery after a crash at any point,
    never sends it again, and a crash before the commit sends it on recovery.
    An unknown or finished target raises WorkflowNotFound or WorkflowFinished
    (journaled: a replay raises it again).
    """
    run = context.require_run("send_signal")
    validate.name(workflow_id, "send_signal(workflow_id)")
    validate.name(name, "signal name")
    data = codec.encode(payload, where=f"signal {name!r} payload")
    seq = run.take_seq(kind=journal.Kind.SEND, name=f"{name} -> {workflow_id}")
    return _send(run, seq, workflow_id, name, data)


@races.durable_call
async def _send(run: Run, seq: int, target: str, name: str, data: str) -> None:
    label = f"{name} -> {target}"
    entry = run.lookup(seq, journal.Kind.SEND, label)
    if entry is None:
        now = run.clock()
        send = journal.Entry(seq, journal.Kind.SEND, label, _STARTED, 1, None, now)
        entry = await run.write("post_signal", send, target, name, data)
        faults.reached("after_send", name)
        if entry.status == journal.EntryStatus.COMPLETED:
            run.signal_sent(target, name)
    if entry.status == journal.EntryStatus.FAILED:
        recorded = codec.decode(entry.payload or "{}", where=f"send of signal {name!r}")
        if isinstance(recorded, dict):
            raise codec.decode_error(recorded)
        raise errors.DecodeError(f"the recorded failure of signal {name!r} is not an object")


def get_event(
    workflow_id: str, key: str, timeout: float | datetime.timedelta | None = None
) -> Coroutine[Any, Any, Any]:
    """The value workflow ``workflow_id`` published under ``key``, journaled.

    Await it. Waits up to ``timeout`` (seconds or a timedelta; None: not at
    all) for the value, then raises TimeoutError. The value read, or the
    timeout, is journaled: a replay returns (or raises) the same without
    reading the store. The deadline is journaled too, so a wait cut by a crash
    or a park waits only what is left. Nothing notifies a published event, so
    the wait reads again at a growing interval (at most a second).
    """
    run = context.require_run("get_event")
    validate.name(workflow_id, "get_event(workflow_id)")
    validate.name(key, "event key")
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    seconds = 0.0 if timeout is None else validate.number(timeout, "get_event(timeout)")
    seq = run.take_seq(kind=journal.Kind.GET_EVENT, name=f"{key} of {workflow_id}")
    return _get_event(run, seq, workflow_id, key, seconds)


@races.durable_call
async def _get_event(run: Run, seq: int, source: str, key: str, timeout: float) -> Any:
    label = f"{key} of {source}"
    entry = run.lookup(seq, journal.Kind.GET_EVENT, label)
    if entry is None:
        now = run.clock()
        entry = journal.Entry(
            seq, journal.Kind.GET_EVENT, label, _STARTED, 1, None, now, None, now + timeout
        )
    while entry.status == _STARTED:
        pokes = run.pokes  # a wake-up from here on (a cancel asked during the read) re-checks
        entry = await run.write("read_event", entry, source, key)
        if entry.status == _STARTED:
            now = run.clock()
            waited = now - (entry.started_at or now)
            pause = min(max(waited / 2, _POLL[0]), _POLL[1])
            wake_at = min(entry.wake_at or now, now + pause)
            await run.block(journal.Kind.GET_EVENT, label, wake_at, pokes)
            run.cancel_point(seq, journal.Kind.GET_EVENT, label)
    if entry.status == journal.EntryStatus.TIMED_OUT:
        raise TimeoutError(
            f"workflow {source!r} had not published {key!r} by the deadline "
            f"(get_event at seq {seq} of workflow {run.workflow_id!r})"
        )
    return codec.decode(entry.payload or "null", where=f"event {key!r} of {source!r}")
