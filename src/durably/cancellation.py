"""When a cancel lands, and what a deadline means: pure decisions (the time is an argument).

A cancel is final once the store accepted it: a workflow that has not started
never starts (:func:`unstarted`), and one whose function returns after the
cancel was committed ends ``cancelled``, its result kept in the row's
``output`` (:func:`final_status`). A deadline (``timeout=`` at start, or on
the decorator) is a cancel that the time asks for: once :func:`passed`, the
workflow is cancelled wherever it is, and its error names the deadline
(:func:`cancelled`). The store verbs and the run carry these out.
"""

from __future__ import annotations

import datetime

from durably import errors, journal


def deadline_of(timeout: float | None, now: float, inherited: float | None = None) -> float | None:
    """The deadline of a workflow started at ``now`` with ``timeout`` seconds, no later than
    the ``inherited`` one (a child's parent's)."""
    own = None if timeout is None else now + timeout
    if own is None or inherited is None:
        return own if inherited is None else inherited
    return min(own, inherited)


def passed(deadline_at: float | None, now: float) -> bool:
    """True once the deadline (if any) is reached."""
    return deadline_at is not None and now >= deadline_at


def asked(cancel_requested: object, deadline_at: float | None, now: float) -> bool:
    """True when the workflow must stop: cancel was requested, or its deadline passed."""
    return bool(cancel_requested) or passed(deadline_at, now)


def final_status(
    status: str, cancel_requested: object, deadline_at: float | None, now: float
) -> str:
    """The status a workflow ending with ``status`` is recorded with.

    A workflow that completes after a cancel was committed (its function
    returned with no durable call left on the way, where the cancel would have
    been raised), or after its deadline, ends ``cancelled``: a cancel, once
    accepted, is final. Its result stays in ``output``. A failure stays a
    failure and a divergence a divergence: they say what went wrong.
    """
    if status == journal.Status.COMPLETED and asked(cancel_requested, deadline_at, now):
        return journal.Status.CANCELLED
    return status


def when(at: float) -> str:
    """A time as the messages name it: ISO 8601 in UTC, to the millisecond."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="milliseconds")


def cancelled(
    workflow_id: str, where: str, deadline_at: float | None, at: float
) -> errors.Cancelled:
    """The Cancelled a workflow receives, or ends with, ``where`` (``"(seq 3)"``) at ``at``.

    Names the deadline when it had passed by then: that is why it stopped.
    """
    why = ""
    if deadline_at is not None and passed(deadline_at, at):
        why = f": its deadline {when(deadline_at)} passed"
    return errors.Cancelled(f"workflow {workflow_id!r} was cancelled {where}{why}")
