"""The JSON API of ``durably serve``: the Client's operations over HTTP.

The routes that read are here; those that change state are in
:mod:`durably.server.api_changes`; how a route is declared and checked is in
:mod:`durably.server.routing`. :func:`starlette_routes` gives them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from durably import client as client_module
from durably import errors, journal
from durably.agents import decisions
from durably.server import journal_pages, routing, signal_pages, views
from durably.server.api_changes import CANCELLED_BY, cancel_as, resolution
from durably.server.routing import (
    MAX_LIMIT,
    ROUTES,
    WORKFLOW_PATH,
    BadInput,
    Context,
    Param,
    Spec,
    call,
    query_limit,
    query_number,
    query_text,
    route,
    status_of,
)
from durably.storage.base import WorkflowQuery

__all__ = ["CANCELLED_BY", "ROUTES", "Spec", "cancel_as", "resolution", "status_of"]


def starlette_routes() -> list[Route]:
    """The Starlette routes of every declared API route (reading and changing)."""
    return routing.starlette_routes()


# --- reading ------------------------------------------------------------------------------

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
    limit = query_limit(request, 50)
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


#: No count the dashboard shows goes past this (it then shows "10000+"): a count reads
#: at most this many index entries a status, where an exact one reads every workflow's
#: (14 ms on SQLite, 40 ms on PostgreSQL at 200,000 finished), and an open page's
#: stream reads the counts again whenever what it shows changed.
COUNT_CAP = 10_000


@route(
    Spec(
        "GET",
        "/api/summary",
        "How many workflows each status has",
        query=(
            Param(
                "cap",
                "integer",
                "Count no further than this (at least 1): 'capped' lists the statuses "
                "that have at least this many; without it every count is exact, a read "
                "that grows with history",
            ),
        ),
        errors=(422,),
    )
)
async def summary(request: Request, ctx: Context) -> Any:
    cap = query_number(request, "cap", int)  # checked by count_by_status (a 422)
    counts = await call(ctx.client.count_by_status, cap)
    return {
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "total": sum(counts.values()),
        "capped": [s for s in STATUSES if cap is not None and counts.get(s, 0) >= cap],
    }


@route(Spec("GET", WORKFLOW_PATH, "One workflow's row", errors=(404,)))
async def get_workflow(request: Request, ctx: Context) -> Any:
    info = await call(ctx.client.get_workflow, request.path_params["workflow_id"])
    return views.workflow(info)


@route(
    Spec(
        "GET",
        WORKFLOW_PATH + "/history",
        "The journal, its timeline, claims and signals: the whole journal and every "
        "signal, or with any of limit, after_seq and before_seq one page of it (the newest "
        "unless a seq says which) and a 'page' object saying how to fetch the next, the "
        f"newest {signal_pages.SIGNALS_PAGE} signals only and 'signals_count' saying how "
        "many there are (GET .../signals pages through the rest)",
        query=(
            Param(
                "limit",
                "integer",
                f"Entries per page, 1 to {MAX_LIMIT} (default {journal_pages.TIMELINE_PAGE} "
                "when a seq is given)",
            ),
            Param(
                "after_seq",
                "integer",
                "The page of the entries after this seq, oldest first (0: the first page); "
                "a page's page.later_after_seq names the next",
            ),
            Param(
                "before_seq",
                "integer",
                "The page of the entries before this seq; a page's page.earlier_before_seq "
                "names the one before it",
            ),
        ),
        errors=(404, 422),
    )
)
async def history(request: Request, ctx: Context) -> Any:
    """Without paging parameters the whole journal and every signal, as it always was (a
    long agent's are megabytes: page them); with any, one page, its usage line still the
    whole journal's, and the newest signals with their count."""
    wid = request.path_params["workflow_id"]
    paged = any(request.query_params.get(key) for key in ("limit", "after_seq", "before_seq"))
    claims = await call(ctx.client.claims, wid)
    more: dict[str, Any] = {}
    if not paged:
        shown = views.journal_document(await call(ctx.client.history, wid), claims)
        sent = await call(ctx.client.signals, wid)
    else:
        page = await call(
            journal_pages.read,
            ctx.client,
            wid,
            after_seq=query_number(request, "after_seq", int),
            before_seq=query_number(request, "before_seq", int),
            limit=query_limit(request, journal_pages.TIMELINE_PAGE),
            claims=claims,
        )
        shown = views.journal_document(
            page.entries,
            claims,
            calls=await call(journal_pages.model_calls, ctx.client, wid),
            before=page.before,
            after=page.after,
            to_end=page.ends_journal,
        )
        signals = await call(signal_pages.read, ctx.client, wid, count=page.mark.signals)
        sent = signals.signals
        more = {"page": page.describe(), "signals_count": signals.count}
    return {
        "workflow_id": wid,
        **shown,
        "signals": [{**s, "payload": views.payload(s.get("payload"))} for s in sent],
        **more,
    }


@route(
    Spec(
        "GET",
        WORKFLOW_PATH + "/signals",
        "One page of the signals sent to the workflow, consumed or not, in num order: the "
        "newest unless before_num says which, with 'count' (how many there are) and "
        "'earlier_before_num' (the before_num of the page before it; null at the first)",
        query=(
            Param(
                "limit",
                "integer",
                f"Signals per page, 1 to {MAX_LIMIT} (default {signal_pages.SIGNALS_PAGE})",
            ),
            Param(
                "before_num",
                "integer",
                "The page of the signals before this num; a page's earlier_before_num "
                "names the one before it",
            ),
        ),
        errors=(404, 422),
    )
)
async def signals(request: Request, ctx: Context) -> Any:
    wid = request.path_params["workflow_id"]
    limit = query_limit(request, signal_pages.SIGNALS_PAGE)
    before_num = query_number(request, "before_num", int)
    page = await call(signal_pages.read, ctx.client, wid, before_num=before_num, limit=limit)
    document = page.describe()
    document["signals"] = [{**s, "payload": views.payload(s.get("payload"))} for s in page.signals]
    return document


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
#: Seconds between two reads of the finished workflows' counts by an open stream whose
#: look did not change: they grow with history (a read of every finished workflow's
#: index entry), and a change among them alone (a retention's delete) is the only one
#: they show first.
EVENTS_FINISHED_EVERY = 10.0


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
    looked = await call(looked_at, ctx.client, wid)
    finished = await call(finished_counts, ctx.client)
    return StreamingResponse(
        _event_stream(request, ctx.client, wid, looked, finished, seconds),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _event_stream(
    request: Request,
    client: client_module.Client,
    workflow_id: str | None,
    looked: list[Any],
    finished: dict[str, int],
    seconds: float,
) -> AsyncIterator[str]:
    """Yields a ``version`` event at once and after every change, until ``seconds`` pass.

    Each open stream looks at the store every :data:`EVENTS_INTERVAL` seconds
    (:func:`looked_at`: reads that do not grow with history) and reads the finished
    workflows' counts again when that look changed or every
    :data:`EVENTS_FINISHED_EVERY` seconds; its versions are those of /api/poll. Any
    number of server processes may serve one database because the change is read
    from the database itself.
    """
    loop_time = asyncio.get_running_loop().time
    end = loop_time() + seconds
    last = fingerprint(looked, finished)
    spoke = loop_time()
    counted = loop_time()  # when ``finished`` was read
    yield f"retry: 2000\nevent: version\ndata: {json.dumps({'version': last})}\n\n"
    while loop_time() < end:
        await asyncio.sleep(min(EVENTS_INTERVAL, max(0.0, end - loop_time())))
        if await request.is_disconnected():
            return
        try:
            now_looked = await call(looked_at, client, workflow_id)
            if now_looked != looked or loop_time() - counted >= EVENTS_FINISHED_EVERY:
                finished, counted = await call(finished_counts, client), loop_time()
            looked = now_looked
            now = fingerprint(looked, finished)
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


def finished_counts(client: client_module.Client) -> dict[str, int]:
    """How many workflows each finished status has, as the list page shows them (up to
    ``COUNT_CAP``: a read that does not grow with history past it). A status past the
    cap stays at it: a delete among its workflows alone changes no version."""
    finished = frozenset(journal.FINISHED_STATUSES)
    return {s: n for s, n in client.count_by_status(COUNT_CAP).items() if s in finished}


def looked_at(client: client_module.Client, workflow_id: str | None) -> list[Any]:
    """What a page shows, read in reads that do not grow with history: the unfinished
    workflows' counts, the newest workflow or the page's own (its row and its journal's
    mark, not its entries), open reviews, approvals."""
    parts: list[Any] = [sorted(client.count_unfinished().items())]
    if workflow_id is not None:
        info = client.get_workflow(workflow_id)
        # not the journal itself: a long agent's entries are megabytes, read every half second
        mark = client.history_mark(workflow_id)
        parts += [info.status, info.updated_at, dataclasses.astuple(mark)]
    else:
        latest = client.search_workflows(WorkflowQuery(limit=1))
        parts.append([(w.workflow_id, w.status, w.updated_at) for w in latest])
    parts.append([(r.workflow_id, r.seq) for r in client.reviews()])
    parts.append([p.approval_id for p in decisions.list_approvals(client, workflow_id)])
    return parts


def fingerprint(looked: list[Any], finished: dict[str, int]) -> str:
    """The version of what :func:`looked_at` read with the finished statuses' counts."""
    parts = [*looked, sorted(finished.items())]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def version(client: client_module.Client, workflow_id: str | None) -> str:
    """A fingerprint of the state a page shows: it differs after any change a page renders."""
    return fingerprint(looked_at(client, workflow_id), finished_counts(client))


def schema_routes() -> list[tuple[str, str]]:
    """(method, path) of every API route, for the document and its test."""
    return [(spec.method, spec.path) for spec, _ in ROUTES]
