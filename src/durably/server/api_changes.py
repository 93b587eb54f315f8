"""The routes of the JSON API that change state: start, signal, cancel, resume, fork,
approve, reject and resolve (declared with :func:`durably.server.routing.route`)."""

from __future__ import annotations

import inspect
import time
from typing import Any

from starlette.requests import Request

from durably import client as client_module
from durably import errors
from durably.agents import decisions
from durably.server import views
from durably.server.routing import (
    WORKFLOW_PATH,
    BadInput,
    Context,
    Spec,
    body_of,
    call,
    route,
    text,
)

# --- changing -----------------------------------------------------------------------------

_ANY: dict[str, Any] = {}  # a JSON schema that accepts any value


#: The keyword-only options of Client.start: a kwarg under one of these names would be
#: taken as that option (a ``timeout`` kwarg as the workflow's deadline), not passed.
_START_OPTIONS = frozenset(
    name
    for name, p in inspect.signature(client_module.Client.start).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)


@route(
    Spec(
        "POST",
        "/api/workflows",
        "Start a workflow by name (pending until a worker that has its code claims it)",
        body={
            "type": "object",
            "required": ["workflow"],
            "properties": {
                "workflow": {"type": "string", "description": "The workflow's name"},
                "args": {"type": "array", "description": "Positional arguments"},
                "kwargs": {"type": "object", "description": "Keyword arguments"},
                "workflow_id": {"type": "string", "description": "Its id (idempotent)"},
            },
        },
        ok=201,
        errors=(409, 422),
    )
)
async def start(request: Request, ctx: Context) -> Any:
    body = await body_of(request)
    name = text(body, "workflow", required=True)
    args = body.get("args", [])
    kwargs = body.get("kwargs", {})
    if not isinstance(args, list):
        raise BadInput("the field 'args' must be a JSON array")
    if not isinstance(kwargs, dict):
        raise BadInput("the field 'kwargs' must be a JSON object")
    taken = sorted(set(kwargs) & _START_OPTIONS)
    if taken:
        raise BadInput(
            f"the field 'kwargs' holds {taken[0]!r}, the name of an option of Client.start: "
            "a workflow's keyword argument cannot be passed under it"
        )
    workflow_id = text(body, "workflow_id")
    wid = await call(ctx.client.start, name, *args, workflow_id=workflow_id, **kwargs)
    return views.workflow(await call(ctx.client.get_workflow, wid))


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/signals",
        "Send a signal (committed before the answer)",
        body={
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "payload": _ANY,
                "idempotency_key": {"type": "string"},
            },
        },
        errors=(404, 422),
    )
)
async def signal(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    body = await body_of(request)
    name = text(body, "name", required=True)
    key = text(body, "idempotency_key")
    await call(ctx.client.get_workflow, wid)  # 404 before anything is stored
    sent = await call(ctx.client.send_signal, wid, name, body.get("payload"), key)
    return {"workflow_id": wid, "name": name, "sent": sent}


_BY = {"by": {"type": "string", "description": "Who decides, when the token has no name"}}


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/cancel",
        "Cancel the workflow and its unfinished children; records who asked",
        body={"type": "object", "properties": _BY},
        errors=(404,),
    )
)
async def cancel(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    body = await body_of(request)
    by = ctx.by(body)
    asked = await call(cancel_as, ctx.client, wid, by)
    return {"workflow_id": wid, "cancelled": asked, "by": by}


CANCELLED_BY = "durably:cancelled_by"


def cancel_as(client: client_module.Client, workflow_id: str, by: str) -> list[str]:
    """Cancel the workflow and record who asked; the ids asked to stop.

    Who asked is kept as a signal named ``durably:cancelled_by`` that no
    workflow waits on: durable, in the same database, and listed with the
    workflow's other signals. It is sent before the cancel, while the
    workflow is surely not finished by it. A workflow already finished (a
    second cancel: the first ended it, or it ended meanwhile) has nothing to
    stop and nothing to record: none asked, as ``Client.cancel`` answers.
    """
    client.get_workflow(workflow_id)  # 404 before anything is stored
    record = {"by": by, "at": time.time()}
    try:
        client.send_signal(workflow_id, CANCELLED_BY, record)
    except errors.WorkflowFinished:
        return []
    return client.cancel(workflow_id)


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/resume",
        "Run a failed, cancelled or diverged workflow again from where it stopped",
        errors=(404, 409),
    )
)
async def resume(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    await call(ctx.client.resume, wid)
    return views.workflow(await call(ctx.client.get_workflow, wid))


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/fork",
        "Start a copy that replays the first from_seq journal entries",
        body={
            "type": "object",
            "required": ["from_seq"],
            "properties": {"from_seq": {"type": "integer"}, "new_id": {"type": "string"}},
        },
        ok=201,
        errors=(404, 409, 422),
    )
)
async def fork(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    body = await body_of(request)
    from_seq = body.get("from_seq")
    if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
        raise BadInput("the field 'from_seq' must be a non-negative integer")
    new_id = await call(ctx.client.fork, wid, from_seq, text(body, "new_id"))
    return views.workflow(await call(ctx.client.get_workflow, new_id))


_DECISION = {
    "expect": {"type": "string", "description": "The args_sha256 of the call you were shown"},
    "tool_call_id": {"type": "string", "description": "Which call, if several wait"},
    **_BY,
}


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/approve",
        "Approve the pending tool call whose arguments hash is 'expect'",
        body={
            "type": "object",
            "required": ["expect"],
            "properties": {**_DECISION, "note": {"type": "string"}},
        },
        errors=(404, 409, 422),
    )
)
async def approve(request: Request, ctx: Context) -> Any:
    return await _decide(request, ctx, "approve")


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/reject",
        "Reject the pending tool call whose arguments hash is 'expect'; the model reads why",
        body={
            "type": "object",
            "required": ["expect"],
            "properties": {**_DECISION, "reason": {"type": "string"}},
        },
        errors=(404, 409, 422),
    )
)
async def reject(request: Request, ctx: Context) -> Any:
    return await _decide(request, ctx, "reject")


async def _decide(request: Request, ctx: Context, action: str) -> Any:
    wid = request.path_params["workflow_id"]
    body = await body_of(request)
    by = ctx.by(body)
    expect = text(body, "expect", required=True)
    tool_call_id = text(body, "tool_call_id")
    await call(ctx.client.get_workflow, wid)
    if action == "approve":
        note = text(body, "note") or ""
        decided = await call(
            decisions.approve,
            ctx.client,
            wid,
            by=by,
            tool_call_id=tool_call_id,
            expect=expect,
            note=note,
        )
    else:
        reason = text(body, "reason") or ""
        decided = await call(
            decisions.reject,
            ctx.client,
            wid,
            by=by,
            reason=reason,
            tool_call_id=tool_call_id,
            expect=expect,
        )
    return {"decision": action, "by": by, "approval": views.approval(decided)}


@route(
    Spec(
        "POST",
        WORKFLOW_PATH + "/reviews/{seq}/resolve",
        "Decide a parked step once: its result, retry, or fail with a reason",
        body={
            "type": "object",
            "properties": {
                "result": {"description": "The step's result: it happened"},
                "retry": {"type": "boolean", "description": "It did not happen: run it again"},
                "fail": {"type": "string", "description": "Fail the step with this reason"},
                "attempt": {
                    "type": "integer",
                    "description": "The attempt of the review you were shown; a decision "
                    "made for an earlier review at that seq is refused (409). Without it, "
                    "the review open there now",
                },
                **_BY,
            },
        },
        errors=(404, 409, 422),
    )
)
async def resolve(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    try:
        seq = int(request.path_params["seq"])
    except ValueError:
        raise BadInput(f"seq must be an integer, not {request.path_params['seq']!r}") from None
    body = await body_of(request)
    by = ctx.by(body)
    choice = resolution(body)
    attempt = body.get("attempt")
    if attempt is not None and (
        not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1
    ):
        raise BadInput("the field 'attempt' must be a positive integer")
    await call(ctx.client.get_workflow, wid)
    decided = await call(ctx.client.resolve, wid, seq, by=by, attempt=attempt, **choice)
    return views.review(decided)


def resolution(body: dict[str, Any]) -> dict[str, Any]:
    """The one decision a resolve body makes; BadInput unless exactly one is given."""
    given = ["result"] if "result" in body else []
    given += [k for k in ("retry", "fail") if body.get(k) is not None and body.get(k) is not False]
    if len(given) != 1:
        raise BadInput("give exactly one of 'result', 'retry': true or 'fail': reason")
    if given == ["retry"]:
        if body["retry"] is not True:
            raise BadInput("'retry' must be true")
        return {"retry": True}
    if given == ["fail"]:
        return {"fail": text(body, "fail", required=True)}
    return {"result": body["result"]}
