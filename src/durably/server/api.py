"""The JSON API of ``durably serve``: the Client's operations over HTTP.

Each route is declared once with :func:`route`, which records what the
OpenAPI document says about it (:mod:`durably.server.openapi` reads
:data:`ROUTES`) and wraps the handler with the checks every route shares: a
caller who is not authenticated gets 401, a cookie request that changes state
without its CSRF token 403, and durably's errors become JSON with a status
(404 unknown workflow, 409 a conflict with the workflow's state, 422 bad input).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from durably import client as client_module
from durably import errors
from durably.agents import decisions
from durably.server import auth, views
from durably.storage.base import WorkflowQuery

Handler = Callable[[Request, "Context"], Awaitable[Any]]

MAX_LIMIT = 500


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """A query parameter as the OpenAPI document describes it."""

    name: str
    type: str
    description: str
    enum: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
    """What one route does, for the OpenAPI document."""

    method: str
    path: str
    summary: str
    query: tuple[Param, ...] = ()
    body: dict[str, Any] | None = None  # JSON schema of the request body
    ok: int = 200
    errors: tuple[int, ...] = ()
    media: str = "application/json"  # what a successful answer is


@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    """What a handler gets besides the request: the client and who is asking."""

    client: client_module.Client
    identity: auth.Identity

    def by(self, body: dict[str, Any]) -> str:
        """Who a decision is recorded under: the session's or token's name, else ``by``."""
        if self.identity.name:
            return self.identity.name
        given = body.get("by")
        if given is not None and (not isinstance(given, str) or not given.strip()):
            raise BadInput("'by' must be a non-empty string")
        return given.strip() if isinstance(given, str) else "api"


class BadInput(ValueError):
    """A request the API cannot take: the message names the field."""


class Refused(Exception):
    """The caller may not do this: 401 unauthenticated or 403 forbidden."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


ROUTES: list[tuple[Spec, Handler]] = []


def route(spec: Spec) -> Callable[[Handler], Handler]:
    """Declare a route of the API (its OpenAPI description and its handler)."""

    def register(handler: Handler) -> Handler:
        ROUTES.append((spec, handler))
        return handler

    return register


def error(status: int, kind: str, message: str) -> JSONResponse:
    """The JSON error body every route answers with."""
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def status_of(exc: Exception) -> int:
    """The HTTP status of a durably (or input) error."""
    if isinstance(exc, errors.WorkflowNotFound):
        return 404
    if isinstance(exc, errors.StoreError):
        return 503
    if isinstance(exc, errors.EncodeError | errors.DecodeError | BadInput | ValueError | TypeError):
        return 422
    return 409  # NothingToResolve, ApprovalError, WorkflowIdConflict, reopen of a live one


def identify(request: Request, state: Any, changes_state: bool) -> auth.Identity:
    """The caller, or Refused: a bearer token, else a session cookie (with CSRF if it writes)."""
    checker: auth.Auth = state.auth
    header = request.headers.get("authorization")
    if header:
        token = checker.bearer(header)
        if token is None:
            raise Refused(401, "the bearer token is not valid")
        return auth.Identity(token.name or "", via_cookie=False)
    identity = checker.session(request.cookies.get(auth.COOKIE), time.time())
    if identity is None:
        raise Refused(401, "authentication required: send 'Authorization: Bearer <token>'")
    if changes_state and not checker.check_csrf(identity, request.headers.get(auth.CSRF_HEADER)):
        raise Refused(403, "a request made with the session cookie needs its CSRF token")
    return identity


def starlette_routes() -> list[Route]:
    """The Starlette routes of every declared API route."""
    return [
        Route(spec.path, _endpoint(spec, handler), methods=[spec.method], name=handler.__name__)
        for spec, handler in ROUTES
    ]


def _endpoint(spec: Spec, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        state = request.app.state
        try:
            identity = identify(request, state, spec.method != "GET")
        except Refused as refused:
            return error(
                refused.status,
                "Unauthorized" if refused.status == 401 else "Forbidden",
                str(refused),
            )
        try:
            result = await handler(request, Context(state.client, identity))
        except (errors.DurablyError, ValueError, TypeError) as exc:
            return error(status_of(exc), type(exc).__name__, str(exc))
        if isinstance(result, Response):  # a stream (the events route)
            return result
        return JSONResponse(result, status_code=spec.ok)

    return endpoint


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a synchronous Client call off the event loop."""
    return await run_in_threadpool(fn, *args, **kwargs)


# --- input --------------------------------------------------------------------------------


async def body_of(request: Request) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise BadInput(f"the request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadInput("the request body must be a JSON object")
    return value


def text(body: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    """A string field of the body; BadInput names it when it is of another type or missing."""
    value = body.get(key)
    if value is None:
        if required:
            raise BadInput(f"the field {key!r} is required")
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadInput(f"the field {key!r} must be a non-empty string")
    return value


def query_number(request: Request, key: str, kind: type[int] | type[float]) -> Any:
    """A numeric query parameter, or None; BadInput names it when it is not a number."""
    value = request.query_params.get(key)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except ValueError:
        raise BadInput(f"the query parameter {key!r} must be a number, not {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise BadInput(f"the query parameter {key!r} must be a finite number")
    return number


def query_text(request: Request, key: str) -> str | None:
    """A text query parameter, or None when absent or empty."""
    return request.query_params.get(key) or None


# --- reading ------------------------------------------------------------------------------

_ID = "/api/workflows/{workflow_id}"
STATUSES = (
    "pending",
    "running",
    "sleeping",
    "waiting",
    "needs_review",
    "completed",
    "failed",
    "cancelled",
    "diverged",
)


@route(
    Spec(
        "GET",
        "/api/workflows",
        "List workflows, newest first, one page at a time",
        query=(
            Param("status", "string", "Only this status", STATUSES),
            Param("name", "string", "Only workflows of this name"),
            Param("queue", "string", "Only workflows enqueued on this queue"),
            Param("id_prefix", "string", "Only ids that start with this (no wildcards)"),
            Param("parent_id", "string", "Only children of this workflow"),
            Param("order", "string", "desc (newest first, the default) or asc", ("desc", "asc")),
            Param("created_after", "number", "Created at or after (epoch seconds)"),
            Param("created_before", "number", "Created before (epoch seconds)"),
            Param("cursor", "string", "The next_cursor of the previous page"),
            Param("limit", "integer", f"Rows per page, 1 to {MAX_LIMIT} (default 50)"),
        ),
        errors=(422,),
    )
)
async def list_workflows(request: Request, ctx: Context) -> Any:
    limit = query_number(request, "limit", int)
    limit = 50 if limit is None else limit
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"the query parameter 'limit' must be between 1 and {MAX_LIMIT}")
    cursor = query_text(request, "cursor")
    order = query_text(request, "order") or "desc"
    if order not in ("desc", "asc"):
        raise BadInput(f"the query parameter 'order' must be 'desc' or 'asc', not {order!r}")
    query = WorkflowQuery(
        status=query_text(request, "status"),
        name=query_text(request, "name"),
        queue=query_text(request, "queue"),
        id_prefix=query_text(request, "id_prefix"),
        parent_id=query_text(request, "parent_id"),
        order=order,
        created_after=query_number(request, "created_after", float),
        created_before=query_number(request, "created_before", float),
        after=views.decode_cursor(cursor) if cursor else None,
        limit=limit + 1,
    )
    rows = await call(ctx.client.search_workflows, query)
    page = rows[:limit]
    more = len(rows) > limit
    return {
        "workflows": [views.workflow(r) for r in page],
        "next_cursor": views.encode_cursor(page[-1]) if more else None,
    }


@route(Spec("GET", "/api/summary", "How many workflows each status has"))
async def summary(request: Request, ctx: Context) -> Any:
    counts = await call(ctx.client.count_by_status)
    return {"counts": {s: counts.get(s, 0) for s in STATUSES}, "total": sum(counts.values())}


@route(Spec("GET", _ID, "One workflow's row", errors=(404,)))
async def get_workflow(request: Request, ctx: Context) -> Any:
    info = await call(ctx.client.get_workflow, request.path_params["workflow_id"])
    return views.workflow(info)


@route(
    Spec("GET", _ID + "/history", "The journal, its timeline, claims and signals", errors=(404,))
)
async def history(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    entries = await call(ctx.client.history, wid)
    claims = await call(ctx.client.claims, wid)
    signals = await call(ctx.client.signals, wid)
    return {
        "workflow_id": wid,
        "entries": [views.entry(e) for e in entries],
        "timeline": views.timeline(entries, claims),
        "usage": views.usage_line(entries, claims),
        "claims": [dataclasses.asdict(c) for c in claims],
        "signals": [{**s, "payload": views.payload(s.get("payload"))} for s in signals],
    }


@route(
    Spec(
        "GET",
        "/api/approvals",
        "Tool calls waiting for a person's approval, with their exact arguments",
        query=(Param("workflow_id", "string", "Only this workflow's"),),
        errors=(404,),
    )
)
async def approvals(request: Request, ctx: Context) -> Any:
    pending = await call(decisions.list_approvals, ctx.client, query_text(request, "workflow_id"))
    return {"approvals": [views.approval(p) for p in pending]}


@route(
    Spec(
        "GET",
        "/api/reviews",
        "Steps parked for a person's decision (needs_review), oldest first",
        query=(Param("workflow_id", "string", "Only this workflow's"),),
    )
)
async def reviews(request: Request, ctx: Context) -> Any:
    rows = await call(ctx.client.reviews, query_text(request, "workflow_id"))
    return {"reviews": [views.review(r) for r in rows]}


@route(Spec("GET", "/api/workers", "The executors (workers) registered in the database"))
async def workers(request: Request, ctx: Context) -> Any:
    rows = await call(ctx.client.executors)
    now = time.time()
    return {"workers": [views.executor(e, now) for e in rows]}


@route(
    Spec(
        "GET",
        "/api/poll",
        "A version that changes whenever what a dashboard page shows may have changed",
        query=(Param("workflow_id", "string", "The workflow a page shows, if one"),),
        errors=(404,),
    )
)
async def poll(request: Request, ctx: Context) -> Any:
    wid = query_text(request, "workflow_id")
    return {"version": await call(version, ctx.client, wid)}


EVENTS_INTERVAL = 0.5  # seconds between two looks at the store, per open stream
EVENTS_KEEPALIVE = 15.0  # seconds of silence after which a comment line is sent
EVENTS_DEFAULT_SECONDS = 300.0  # how long a stream lasts before the browser reconnects
EVENTS_MAX_SECONDS = 3600.0


@route(
    Spec(
        "GET",
        "/api/events",
        "Server-sent events: a 'version' event now and whenever what a dashboard page shows "
        "may have changed (the /api/poll version, pushed)",
        query=(
            Param("workflow_id", "string", "The workflow a page shows, if one"),
            Param(
                "seconds",
                "number",
                f"How long the stream stays open (default {EVENTS_DEFAULT_SECONDS:.0f}, "
                f"at most {EVENTS_MAX_SECONDS:.0f}); an EventSource reconnects by itself",
            ),
        ),
        errors=(404, 422),
        media="text/event-stream",
    )
)
async def events(request: Request, ctx: Context) -> Any:
    wid = query_text(request, "workflow_id")
    seconds = query_number(request, "seconds", float)
    if seconds is None:
        seconds = EVENTS_DEFAULT_SECONDS
    if not 0 <= seconds <= EVENTS_MAX_SECONDS:
        raise BadInput(
            f"the query parameter 'seconds' must be between 0 and {EVENTS_MAX_SECONDS:.0f}"
        )
    # The first version is read before the stream starts, so an unknown workflow
    # is a 404 rather than a stream that ends at once.
    first = await call(version, ctx.client, wid)
    return StreamingResponse(
        _event_stream(request, ctx.client, wid, first, seconds),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _event_stream(
    request: Request,
    client: client_module.Client,
    workflow_id: str | None,
    first: str,
    seconds: float,
) -> AsyncIterator[str]:
    """Yields a ``version`` event at once and after every change, until ``seconds`` pass.

    Each open stream looks at the store every :data:`EVENTS_INTERVAL` seconds
    (the same cheap reads as /api/poll); any number of server processes may
    serve one database because the change is read from the database itself.
    """
    loop_time = asyncio.get_running_loop().time
    end = loop_time() + seconds
    last = first
    spoke = loop_time()
    yield f"retry: 2000\nevent: version\ndata: {json.dumps({'version': first})}\n\n"
    while loop_time() < end:
        await asyncio.sleep(min(EVENTS_INTERVAL, max(0.0, end - loop_time())))
        if await request.is_disconnected():
            return
        try:
            now = await call(version, client, workflow_id)
        except errors.WorkflowNotFound:
            return  # deleted (retention): the page's next load says so
        except errors.StoreError:
            continue  # the database is away for a moment: look again
        if now != last:
            last, spoke = now, loop_time()
            yield f"event: version\ndata: {json.dumps({'version': now})}\n\n"
        elif loop_time() - spoke > EVENTS_KEEPALIVE:
            spoke = loop_time()
            yield ": keep-alive\n\n"


def version(client: client_module.Client, workflow_id: str | None) -> str:
    """A fingerprint of the state a page shows: it differs after any change a page renders."""
    parts: list[Any] = [sorted(client.count_by_status().items())]
    if workflow_id is not None:
        info = client.get_workflow(workflow_id)
        entries = client.history(workflow_id)
        parts += [
            info.status,
            info.updated_at,
            [(e.seq, e.status, e.attempt) for e in entries],
            len(client.signals(workflow_id)),
        ]
    else:
        latest = client.search_workflows(WorkflowQuery(limit=1))
        parts.append([(w.workflow_id, w.status, w.updated_at) for w in latest])
    parts.append([(r.workflow_id, r.seq) for r in client.reviews()])
    parts.append([p.approval_id for p in decisions.list_approvals(client, workflow_id)])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


# --- changing -----------------------------------------------------------------------------

_ANY: dict[str, Any] = {}  # a JSON schema that accepts any value


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
    workflow_id = text(body, "workflow_id")
    wid = await call(ctx.client.start, name, *args, workflow_id=workflow_id, **kwargs)
    return views.workflow(await call(ctx.client.get_workflow, wid))


@route(
    Spec(
        "POST",
        _ID + "/signals",
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
        _ID + "/cancel",
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
    workflow is surely not finished by it.
    """
    client.get_workflow(workflow_id)  # 404 before anything is stored
    record = {"by": by, "at": time.time()}
    client.send_signal(workflow_id, CANCELLED_BY, record)
    return client.cancel(workflow_id)


@route(
    Spec(
        "POST",
        _ID + "/resume",
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
        _ID + "/fork",
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
        _ID + "/approve",
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
        _ID + "/reject",
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
        _ID + "/reviews/{seq}/resolve",
        "Decide a parked step once: its result, retry, or fail with a reason",
        body={
            "type": "object",
            "properties": {
                "result": {"description": "The step's result: it happened"},
                "retry": {"type": "boolean", "description": "It did not happen: run it again"},
                "fail": {"type": "string", "description": "Fail the step with this reason"},
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
    await call(ctx.client.get_workflow, wid)
    decided = await call(ctx.client.resolve, wid, seq, by=by, **choice)
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


def schema_routes() -> list[tuple[str, str]]:
    """(method, path) of every API route, for the document and its test."""
    return [(spec.method, spec.path) for spec, _ in ROUTES]
