"""Deciding approvals from any process: list them, approve or reject once.

:func:`approve` and :func:`reject` read the workflow's pending approvals (its
``approvals:pending`` event, see :mod:`durably.agents.approvals`) and send the
decision as the signal the workflow waits on, with an idempotency key so a
decision is made once. The payload carries who decided, when (UTC, from the
deciding process), and the hash of the arguments that were shown; a decision
made on other arguments is refused here (``ApprovalStale``) and again inside the
workflow. All three work with a :class:`~durably.Client` (synchronous) or an
:class:`~durably.Engine` (they return an awaitable). Their logic is written
once, as a generator of store operations that a sync or an async driver runs.
"""

from __future__ import annotations

import datetime
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, overload

from durably import client as client_module
from durably.agents import exceptions
from durably.agents.approvals import INDEX_EVENT, JSON, PendingApproval

if TYPE_CHECKING:
    from durably.engine import Engine

Op = tuple[Any, ...]
Plan = Generator[Op, Any, Any]


def _pending_of(workflow_id: str) -> Generator[Op, Any, list[PendingApproval]]:
    index = yield ("event", workflow_id, INDEX_EVENT)
    records = index if isinstance(index, list) else []
    return [
        PendingApproval.from_record(r)
        for r in records
        if isinstance(r, dict) and r.get("status") == "pending"
    ]


def _list_plan(workflow_id: str | None, limit: int) -> Generator[Op, Any, list[PendingApproval]]:
    ids = [workflow_id] if workflow_id else []
    if not workflow_id:
        for status in ("waiting", "running"):
            infos = yield ("list", status, limit)
            ids += [info.workflow_id for info in infos]
    found: list[PendingApproval] = []
    for wid in ids:
        found += yield from _pending_of(wid)
    return found


def _decide_plan(
    workflow_id: str,
    approval_id: str | None,
    expect: str | PendingApproval | None,
    fields: JSON,
) -> Generator[Op, Any, PendingApproval]:
    pending = yield from _pending_of(workflow_id)
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
    sent = yield ("signal", workflow_id, chosen.signal, payload, key)
    if not sent:
        raise exceptions.ApprovalAlreadyDecided(
            f"{chosen.describe()} in workflow {workflow_id!r} was already decided"
        )
    return chosen


def _sync(plan: Plan, target: client_module.Client) -> Any:
    result: Any = None
    try:
        while True:
            op = plan.send(result)
            if op[0] == "event":
                try:
                    result = target.get_event(op[1], op[2])
                except TimeoutError:
                    result = None
            elif op[0] == "list":
                result = target.list_workflows(status=op[1], limit=op[2])
            else:
                result = target.send_signal(op[1], op[2], op[3], idempotency_key=op[4])
    except StopIteration as stop:
        return stop.value


async def _async(plan: Plan, target: Engine) -> Any:
    result: Any = None
    try:
        while True:
            op = plan.send(result)
            if op[0] == "event":
                try:
                    result = await target.get_event(op[1], op[2])
                except TimeoutError:
                    result = None
            elif op[0] == "list":
                result = await target.list_workflows(status=op[1], limit=op[2])
            else:
                result = await target.send_signal(op[1], op[2], op[3], idempotency_key=op[4])
    except StopIteration as stop:
        return stop.value


def _drive(plan: Plan, target: client_module.Client | Engine) -> Any:
    if isinstance(target, client_module.Client):
        return _sync(plan, target)
    return _async(plan, target)


@overload
def list_approvals(
    target: client_module.Client, workflow_id: str | None = None, *, limit: int = 1000
) -> list[PendingApproval]: ...
@overload
def list_approvals(
    target: Engine, workflow_id: str | None = None, *, limit: int = 1000
) -> Coroutine[Any, Any, list[PendingApproval]]: ...


def list_approvals(
    target: client_module.Client | Engine, workflow_id: str | None = None, *, limit: int = 1000
) -> Any:
    """Pending approvals of one workflow, or of every waiting or running workflow.

    Scans up to ``limit`` workflows of each status and reads one event each.
    """
    return _drive(_list_plan(workflow_id, limit), target)


def _fields(decision: str, by: str, reason: str, override: JSON | None) -> JSON:
    if not by:
        raise ValueError("a decision needs by= (who made it)")
    at = datetime.datetime.now(datetime.UTC).isoformat()
    return {"decision": decision, "by": by, "at": at, "reason": reason, "override_args": override}


@overload
def approve(
    target: client_module.Client,
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
    target: client_module.Client | Engine,
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
    plan = _decide_plan(
        workflow_id, tool_call_id, expect, _fields("approve", by, note, override_args)
    )
    return _drive(plan, target)


@overload
def reject(
    target: client_module.Client,
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
    target: client_module.Client | Engine,
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
    plan = _decide_plan(workflow_id, tool_call_id, expect, _fields("reject", by, reason, None))
    return _drive(plan, target)
