"""Deciding approvals from any process: list them, approve or reject once.

:func:`approve` and :func:`reject` read the workflow's pending approvals (its
``approvals:pending`` event, see :mod:`durably.agents.approvals`) and send the
decision as the signal the workflow waits on, with an idempotency key so a
decision is made once. The payload carries who decided, when (UTC, from the
deciding process), and the hash of the arguments that were shown; a decision
made on other arguments is refused here (``ApprovalStale``) and again inside the
workflow. All three work with a :class:`~durably.Client` (synchronous) or an
:class:`~durably.Engine` (they return an awaitable), whose methods of the same
names run the plans written here once (:func:`list_plan`, :func:`decide_plan`),
ordinary operation plans of :mod:`durably.operations`.
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any, overload

from durably import codec, errors, operations
from durably.agents import exceptions
from durably.agents.approvals import INDEX_EVENT, JSON, PendingApproval

log = logging.getLogger("durably.agents")

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from durably.client import Client
    from durably.engine import Engine


def _pending_of(
    ops: operations.Operations, workflow_id: str
) -> operations.Plan[list[PendingApproval]]:
    try:
        index = yield from ops.get_event(workflow_id, INDEX_EVENT, None)
    except TimeoutError:  # nothing published yet: nothing pending
        index = None
    return _pending_in(index)


def _pending_in(index: Any) -> list[PendingApproval]:
    """The pending approvals of a workflow's ``approvals:pending`` event value."""
    records = index if isinstance(index, list) else []
    return [
        PendingApproval.from_record(r)
        for r in records
        if isinstance(r, dict) and r.get("status") == "pending"
    ]


def _unreadable(workflow_id: str, exc: errors.DecodeError) -> list[PendingApproval]:
    """None listed for a workflow whose pending approvals cannot be decoded (JSON nested
    deeper than the decoder follows here, a corrupt value), with a warning naming it: one
    such workflow does not take every other's approvals out of a listing with it."""
    log.warning("approvals of workflow %r not listed: %s", workflow_id, exc)
    return []


def list_plan(
    ops: operations.Operations, workflow_id: str | None, limit: int
) -> operations.Plan[list[PendingApproval]]:
    """The pending approvals of one workflow, or of every waiting or running workflow
    (up to ``limit`` of each status that published approvals, newest first, in one read).
    A workflow whose approvals cannot be decoded is left out (``_unreadable``)."""
    if workflow_id:
        try:
            pending: list[PendingApproval] = yield from _pending_of(ops, workflow_id)
        except errors.DecodeError as exc:
            return _unreadable(workflow_id, exc)
        return pending
    found: list[PendingApproval] = []
    for wid, text in (yield from ops.live_events(INDEX_EVENT, limit)):
        try:
            index = codec.decode(text, where=f"event {INDEX_EVENT!r} of {wid!r}")
        except errors.DecodeError as exc:
            found += _unreadable(wid, exc)
            continue
        found += _pending_in(index)
    return found


def decide_plan(
    ops: operations.Operations,
    workflow_id: str,
    approval_id: str | None,
    expect: str | PendingApproval | None,
    fields: JSON,
) -> operations.Plan[PendingApproval]:
    """Send a decision on the one pending approval it names, once; the approval decided."""
    pending = yield from _pending_of(ops, workflow_id)
    if isinstance(expect, PendingApproval):
        approval_id = approval_id or expect.approval_id
    if approval_id is not None:
        pending = [p for p in pending if approval_id in (p.approval_id, p.tool_call_id)]
    if not pending:
        which = f" for {approval_id!r}" if approval_id else ""
        raise exceptions.ApprovalNotPending(
            f"workflow {workflow_id!r} has no pending approval{which}"
        )
    if len(pending) > 1:
        raise exceptions.ApprovalNotPending(
            f"workflow {workflow_id!r} has {len(pending)} pending approvals "
            f"({', '.join(p.approval_id for p in pending)}); pass tool_call_id="
        )
    chosen = pending[0]
    shown = expect.args_sha256 if isinstance(expect, PendingApproval) else expect
    if shown is not None and shown != chosen.args_sha256:
        raise exceptions.ApprovalStale(
            f"the approval pending in {workflow_id!r} is {chosen.describe()}, not the call "
            "the decision was made on; look at it again"
        )
    payload = {**fields, "args_sha256": chosen.args_sha256}
    key = f"decision:{chosen.signal}"
    sent = yield from ops.send_signal(workflow_id, chosen.signal, payload, key)
    if not sent:
        raise exceptions.ApprovalAlreadyDecided(
            f"{chosen.describe()} in workflow {workflow_id!r} was already decided"
        )
    return chosen


def fields(decision: str, by: str, reason: str, override: JSON | None) -> JSON:
    """What a decision's signal carries besides the hash of the arguments shown."""
    if not by:
        raise ValueError("a decision needs by= (who made it)")
    at = datetime.datetime.now(datetime.UTC).isoformat()
    return {"decision": decision, "by": by, "at": at, "reason": reason, "override_args": override}


@overload
def list_approvals(
    target: Client, workflow_id: str | None = None, *, limit: int = 1000
) -> list[PendingApproval]: ...
@overload
def list_approvals(
    target: Engine, workflow_id: str | None = None, *, limit: int = 1000
) -> Coroutine[Any, Any, list[PendingApproval]]: ...


def list_approvals(
    target: Client | Engine, workflow_id: str | None = None, *, limit: int = 1000
) -> Any:
    """Pending approvals of one workflow, or of every waiting or running workflow.

    Reads up to ``limit`` workflows of each status that published approvals, newest
    first, in one statement however many workflows are live.
    """
    return target.list_approvals(workflow_id, limit=limit)


@overload
def approve(
    target: Client,
    workflow_id: str,
    *,
    by: str,
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
    override_args: JSON | None = None,
    note: str = "",
) -> PendingApproval: ...
@overload
def approve(
    target: Engine,
    workflow_id: str,
    *,
    by: str,
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
    override_args: JSON | None = None,
    note: str = "",
) -> Coroutine[Any, Any, PendingApproval]: ...


def approve(
    target: Client | Engine,
    workflow_id: str,
    *,
    by: str,
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
    override_args: JSON | None = None,
    note: str = "",
) -> Any:
    """Approve the workflow's pending tool call (the one named by ``tool_call_id`` if several).

    ``expect`` is the PendingApproval (or its ``args_sha256``) the person was
    shown; a different pending call raises ApprovalStale. ``override_args``
    runs the tool with other arguments instead (the model is told). Raises
    ApprovalNotPending, or ApprovalAlreadyDecided for a second decision.
    Returns the approval that was decided.
    """
    return target.approve(
        workflow_id,
        by=by,
        tool_call_id=tool_call_id,
        expect=expect,
        override_args=override_args,
        note=note,
    )


@overload
def reject(
    target: Client,
    workflow_id: str,
    *,
    by: str,
    reason: str = "",
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
) -> PendingApproval: ...
@overload
def reject(
    target: Engine,
    workflow_id: str,
    *,
    by: str,
    reason: str = "",
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
) -> Coroutine[Any, Any, PendingApproval]: ...


def reject(
    target: Client | Engine,
    workflow_id: str,
    *,
    by: str,
    reason: str = "",
    tool_call_id: str | None = None,
    expect: str | PendingApproval | None = None,
) -> Any:
    """Reject the workflow's pending tool call; the model reads ``rejected by <by>: <reason>``.

    Same selection and checks as :func:`approve`.
    """
    return target.reject(
        workflow_id, by=by, reason=reason, tool_call_id=tool_call_id, expect=expect
    )
