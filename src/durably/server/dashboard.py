"""The dashboard: server-rendered pages (Jinja2, autoescaped) over the same Client calls.

A person logs in with an API token (and a name, when the token has none);
the session cookie is HttpOnly and SameSite=Strict and every form that changes
something carries the session's CSRF token. The pages poll ``/api/poll`` and,
when its version changes, fetch their own HTML again and swap the main part
(static/live.js): no full reload, and no build step.
"""

from __future__ import annotations

import datetime
import time
import urllib.parse
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from durably import client as client_module
from durably import errors
from durably.agents import decisions
from durably.server import api, auth, journal_pages, signal_pages, views, waiting
from durably.server.routing import SegmentRoute, raw_path
from durably.storage.base import WorkflowQuery

PAGE_SIZE = 50


def templates() -> jinja2.Environment:
    """The page templates, with every value escaped unless marked safe."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("durably.server", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.filters["until"] = _until
    env.filters["seconds"] = _seconds
    env.filters["iso"] = _iso
    # a value as one path segment: urlencode leaves "/" as it is, and a browser resolves the
    # dot segments of an id like "../workflows/other" to another workflow's page or action
    env.filters["segment"] = lambda value: urllib.parse.quote(str(value), safe="")
    env.filters["money"] = lambda cost: f"${cost:.4f}" if cost < 0.01 else f"${cost:.2f}"
    return env


def routes() -> list[Route]:
    """The dashboard's pages and form actions (a workflow id's '/' comes as ``%2F``)."""
    return [
        SegmentRoute("/", list_page, methods=["GET"]),
        SegmentRoute("/login", login_page, methods=["GET"]),
        SegmentRoute("/login", login, methods=["POST"]),
        SegmentRoute("/logout", logout, methods=["POST"]),
        SegmentRoute("/workflows/{workflow_id}", workflow_page, methods=["GET"]),
        SegmentRoute("/approvals", approvals_page, methods=["GET"]),
        SegmentRoute("/reviews", reviews_page, methods=["GET"]),
        SegmentRoute("/workers", workers_page, methods=["GET"]),
        SegmentRoute("/workflows/{workflow_id}/approve", decide, methods=["POST"]),
        SegmentRoute("/workflows/{workflow_id}/reject", decide, methods=["POST"]),
        SegmentRoute("/workflows/{workflow_id}/cancel", cancel, methods=["POST"]),
        SegmentRoute("/workflows/{workflow_id}/resume", resume, methods=["POST"]),
        SegmentRoute("/workflows/{workflow_id}/signal", send_signal, methods=["POST"]),
        SegmentRoute(
            "/workflows/{workflow_id}/reviews/{seq:int}/resolve", resolve, methods=["POST"]
        ),
    ]


# --- rendering ----------------------------------------------------------------------------


def _render(
    request: Request, name: str, identity: auth.Identity, status: int = 200, **data: Any
) -> HTMLResponse:
    env: jinja2.Environment = request.app.state.templates
    partial = request.headers.get("x-partial") == "1"
    html = env.get_template(name).render(
        partial=partial,
        me=identity,
        csrf=identity.csrf,
        path=raw_path(request),
        poll_for=data.pop("poll_for", ""),
        **data,
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def _who(request: Request) -> auth.Identity | None:
    checker: auth.Auth = request.app.state.auth
    return checker.session(request.cookies.get(auth.COOKIE), time.time())


def _here(request: Request) -> str:
    """The path and query the request was sent to, as sent (a link back to it)."""
    return raw_path(request) + (f"?{request.url.query}" if request.url.query else "")


def _to_login(request: Request) -> Response:
    target = _here(request)
    return RedirectResponse("/login?" + urllib.parse.urlencode({"next": target}), 303)


def _client(request: Request) -> client_module.Client:
    client: client_module.Client = request.app.state.client
    return client


# --- login --------------------------------------------------------------------------------


async def login_page(request: Request) -> Response:
    nonce = auth.login_nonce(request.cookies.get(auth.LOGIN_COOKIE))
    return _login_form(request, nonce, _safe_next(request.query_params.get("next")), "", 200)


def _login_form(request: Request, nonce: str, target: str, message: str, status: int) -> Response:
    """The login page, its form carrying ``nonce``, which its pre-session cookie holds too."""
    env: jinja2.Environment = request.app.state.templates
    checker: auth.Auth = request.app.state.auth
    # a name is asked for (and refused when missing) only where a token has none of its own
    needs_name = any(token.name is None for token in checker.tokens)
    html = env.get_template("login.html").render(
        next=target, message=message, csrf=nonce, needs_name=needs_name
    )
    response = HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
    if request.cookies.get(auth.LOGIN_COOKIE) != nonce:
        response.set_cookie(
            auth.LOGIN_COOKIE,
            nonce,
            max_age=auth.LOGIN_SECONDS,
            path="/login",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


async def login(request: Request) -> Response:
    form = await request.form()
    target = _safe_next(str(form.get("next") or "/"))
    cookie = request.cookies.get(auth.LOGIN_COOKIE)
    if not auth.check_login_form(cookie, str(form.get(auth.CSRF_FIELD) or "")):
        # another site's post (login CSRF), or a form older than its cookie: a fresh form
        message = "This login form expired or was not sent from this server: log in again."
        return _login_form(request, auth.login_nonce(None), target, message, 403)
    checker: auth.Auth = request.app.state.auth
    token = checker.check_token(str(form.get("token") or ""))
    name = str(form.get("name") or "").strip()
    message = ""
    if token is None:
        message = "That token is not valid."
    elif token.name is None and not name:
        message = "Give your name: decisions are recorded under it."
    if token is None or message:
        return _login_form(request, auth.login_nonce(cookie), target, message, 401)
    response = RedirectResponse(target, 303)
    session = checker.make_session(token, token.name or name[:80], time.time())
    response.set_cookie(
        auth.COOKIE,
        session,
        max_age=auth.SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.delete_cookie(auth.LOGIN_COOKIE, path="/login")
    return response


async def logout(request: Request) -> Response:
    identity = _who(request)
    if identity is not None:
        form = await request.form()
        if not request.app.state.auth.check_csrf(identity, str(form.get(auth.CSRF_FIELD) or "")):
            return PlainTextResponse("missing or wrong CSRF token", 403)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(auth.COOKIE)
    return response


def _safe_next(target: str | None) -> str:
    """Only a path on this server (never ``//host`` or a URL) is a place to go after login."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# --- pages --------------------------------------------------------------------------------


async def list_page(request: Request) -> Response:
    identity = _who(request)
    if identity is None:
        return _to_login(request)
    q = request.query_params
    status = q.get("status") or None
    # the filters of list_workflows a person types: status, name, id prefix, queue, parent
    filters = {"status": status or ""}
    filters.update((key, q.get(key, "")) for key in ("name", "id_prefix", "queue", "parent"))
    message = ""
    try:
        after = views.decode_cursor(q["cursor"]) if q.get("cursor") else None
        query = WorkflowQuery(
            status=status,
            name=filters["name"] or None,
            queue=filters["queue"] or None,
            id_prefix=filters["id_prefix"] or None,
            parent_id=filters["parent"] or None,
            after=after,
            limit=PAGE_SIZE + 1,
        )
        rows = await run_in_threadpool(_client(request).search_workflows, query)
    except ValueError as exc:
        rows, message = [], str(exc)
    counts = await run_in_threadpool(_client(request).count_by_status, api.COUNT_CAP)
    page = rows[:PAGE_SIZE]
    next_cursor = views.encode_cursor(page[-1]) if len(rows) > PAGE_SIZE else None
    next_url = None
    if next_cursor:
        next_url = "/?" + urllib.parse.urlencode(
            {**{k: v for k, v in filters.items() if v}, "cursor": next_cursor}
        )
    return _render(
        request,
        "list.html",
        identity,
        workflows=page,
        counts={s: _count(n) for s, n in counts.items()},
        statuses=api.STATUSES,
        total=_count(sum(counts.values()), any(n >= api.COUNT_CAP for n in counts.values())),
        filters=filters,
        next_url=next_url,
        message=message,
    )


async def workflow_page(request: Request) -> Response:
    identity = _who(request)
    if identity is None:
        return _to_login(request)
    wid = request.path_params["workflow_id"]
    try:
        after, before = (_seq_param(request, key) for key in ("after", "before"))
        signals_before = _seq_param(request, "signals_before", "the num of a signal")
        data = await run_in_threadpool(
            _workflow_data, _client(request), wid, after, before, signals_before
        )
    except errors.WorkflowNotFound as exc:
        return _render(request, "missing.html", identity, message=str(exc))
    except BadPage as exc:  # a page the query names wrongly: say so, with the way back
        return _render(
            request,
            "missing.html",
            identity,
            title="Bad request",
            message=str(exc),
            back=f"/workflows/{urllib.parse.quote(wid, safe='')}",
            status=400,
        )
    here = _here(request)
    return _render(request, "workflow.html", identity, poll_for=wid, here=here, **data)


class BadPage(ValueError):
    """The query names no page of the timeline or the signals (a 400 that says why)."""


def _seq_param(request: Request, key: str, what: str = "the seq of a journal entry") -> int | None:
    """The number a query parameter names (``?before=SEQ``, ``?after=SEQ``,
    ``?signals_before=NUM``), or None."""
    value = request.query_params.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BadPage(f"?{key}= takes {what}, not {value!r}") from None


def _href(at: str, **params: int | None) -> str:
    """``at`` with the query parameters given a value, in the order given."""
    given = {key: value for key, value in params.items() if value is not None}
    return f"{at}?{urllib.parse.urlencode(given)}" if given else at


def _workflow_data(
    client: client_module.Client,
    wid: str,
    after: int | None = None,
    before: int | None = None,
    signals_before: int | None = None,
) -> dict[str, Any]:
    """What the workflow page shows: one page of its timeline (the newest, unless
    ``after`` or ``before`` a seq), the usage line of its whole journal, read from the
    model calls alone, one page of its signals (the newest, unless ``signals_before`` a
    num), and the rest of the workflow. Each pager's links keep the other's page."""
    info = client.get_workflow(wid)
    claims = client.claims(wid)
    try:
        page = journal_pages.read(
            client,
            wid,
            after_seq=after,
            before_seq=before,
            limit=journal_pages.TIMELINE_PAGE,
            claims=claims,
        )
    except ValueError as exc:  # the seqs: out of range, or both given
        # the store's words name its arguments; the page's query says after= and before=
        said = str(exc).replace("after_seq", "?after").replace("before_seq", "?before")
        raise BadPage(said) from exc
    try:
        signals = signal_pages.read(client, wid, before_num=signals_before, count=page.mark.signals)
    except ValueError as exc:  # the num: out of range
        raise BadPage(str(exc).replace("before_num", "?signals_before")) from exc
    calls = journal_pages.model_calls(client, wid)
    waits = [] if info.finished else waiting.waits(client, wid, page.mark, page.entries)
    return {
        "wf": info,
        "input": views.preview_json(info.input),
        "output": views.preview_json(info.output),
        "error": views.preview_json(info.error),
        "failure": views.failure(info.error),
        "waits": waits,
        # the Send signal form, named for the first signal waited for
        "signal_to": next((w["name"] for w in waits if w["kind"] == "signal"), ""),
        "timeline": views.timeline(
            page.entries,
            claims,
            before=page.before,
            after=page.after,
            to_end=page.ends_journal,
        ),
        "paging": _paging(wid, page, signals_before),
        "usage": views.usage_line(calls, claims),
        "signals": [
            {**s, "payload": views.preview_json(s.get("payload"))} for s in signals.signals
        ],
        "signal_paging": _signal_paging(wid, signals, after, before),
        "approvals": [views.approval(p) for p in decisions.list_approvals(client, wid)],
        "reviews": [views.review(r) for r in client.reviews(wid) if r.decision is None],
        "claims": claims,
    }


def _paging(
    wid: str, page: journal_pages.Page, signals_before: int | None = None
) -> dict[str, Any] | None:
    """The line above and below the timeline when it is a page of the journal: which
    entries it shows out of how many, and links to the pages around it (on the page of
    signals shown, ``signals_before``). None when the page is the whole journal."""
    asked = page.after_seq is not None or page.before_seq is not None
    if not asked and page.prior is None and not page.later:
        return None
    at = f"/workflows/{urllib.parse.quote(wid, safe='')}"
    earlier, later = page.earlier_before_seq, page.later_after_seq
    if page.entries:
        first, last = page.entries[0].seq, page.entries[-1].seq
        shown = f"{len(page.entries):,} of {page.count:,} entries (seq {first:,} to {last:,})"
    else:
        shown = f"no entries here, of {page.count:,}"
    keep = signals_before
    return {
        "shown": shown,
        "oldest": _href(at, after=0, signals_before=keep) if earlier is not None else None,
        "earlier": _href(at, before=earlier, signals_before=keep) if earlier is not None else None,
        "later": _href(at, after=later, signals_before=keep) if later is not None else None,
        "newest": _href(at, signals_before=keep) if asked else None,
    }


def _signal_paging(
    wid: str, page: signal_pages.Page, after: int | None, before: int | None
) -> dict[str, Any] | None:
    """The line below the signals when they are a page of them: which it shows out of
    how many, and links to the earlier page and the newest (on the page of the timeline
    shown, ``after`` or ``before``). None when the page holds every signal."""
    asked = page.before_num is not None
    if not asked and page.earlier_before_num is None:
        return None
    at = f"/workflows/{urllib.parse.quote(wid, safe='')}"
    if page.signals:
        first, last = page.signals[0]["num"], page.signals[-1]["num"]
        shown = f"{len(page.signals):,} of {page.count:,} signals (num {first:,} to {last:,})"
    else:
        shown = f"no signals here, of {page.count:,}"
    earlier = page.earlier_before_num
    return {
        "shown": shown,
        "oldest": None,
        "earlier": None
        if earlier is None
        else _href(at, after=after, before=before, signals_before=earlier),
        "later": None,
        "newest": _href(at, after=after, before=before) if asked else None,
    }


async def approvals_page(request: Request) -> Response:
    identity = _who(request)
    if identity is None:
        return _to_login(request)
    pending = await run_in_threadpool(decisions.list_approvals, _client(request), None)
    return _render(
        request, "approvals.html", identity, approvals=[views.approval(p) for p in pending]
    )


async def reviews_page(request: Request) -> Response:
    identity = _who(request)
    if identity is None:
        return _to_login(request)
    rows = await run_in_threadpool(_client(request).reviews, None)
    return _render(
        request,
        "reviews.html",
        identity,
        reviews=[views.review(r) for r in rows if r.decision is None],
    )


async def workers_page(request: Request) -> Response:
    identity = _who(request)
    if identity is None:
        return _to_login(request)
    rows = await run_in_threadpool(_client(request).executors)
    now = time.time()
    shown = [views.executor(e, now) for e in rows]
    return _render(request, "workers.html", identity, workers=shown)


# --- actions ------------------------------------------------------------------------------


async def _action(request: Request) -> tuple[auth.Identity, dict[str, str], str] | Response:
    """The person, form and workflow id of a state-changing post, or the response
    refusing it."""
    identity = _who(request)
    if identity is None:
        return PlainTextResponse("log in first", 401)
    form = await request.form()
    fields = {k: str(v) for k, v in form.items()}
    presented = fields.get(auth.CSRF_FIELD) or request.headers.get(auth.CSRF_HEADER)
    if not request.app.state.auth.check_csrf(identity, presented):
        return PlainTextResponse("missing or wrong CSRF token", 403)
    return identity, fields, request.path_params["workflow_id"]


def _done(request: Request, fields: dict[str, str], wid: str) -> Response:
    at = f"/workflows/{urllib.parse.quote(wid, safe='')}"
    return RedirectResponse(_safe_next(fields.get("back") or at), 303)


def _failed(exc: Exception) -> Response:
    return PlainTextResponse(str(exc), api.status_of(exc))


async def decide(request: Request) -> Response:
    checked = await _action(request)
    if isinstance(checked, Response):
        return checked
    identity, fields, wid = checked
    approving = request.url.path.endswith("/approve")
    expect = fields.get("expect") or None
    if expect is None:
        return PlainTextResponse("the decision must name the arguments hash it was shown", 422)
    kw: dict[str, Any] = {
        "by": identity.name,
        "tool_call_id": fields.get("tool_call_id") or None,
        "expect": expect,
    }
    try:
        if approving:
            await run_in_threadpool(
                lambda: decisions.approve(_client(request), wid, note=fields.get("note", ""), **kw)
            )
        else:
            await run_in_threadpool(
                lambda: decisions.reject(
                    _client(request), wid, reason=fields.get("reason", ""), **kw
                )
            )
    except (errors.DurablyError, ValueError) as exc:
        return _failed(exc)
    return _done(request, fields, wid)


async def cancel(request: Request) -> Response:
    checked = await _action(request)
    if isinstance(checked, Response):
        return checked
    identity, fields, wid = checked
    try:
        await run_in_threadpool(api.cancel_as, _client(request), wid, identity.name)
    except errors.DurablyError as exc:
        return _failed(exc)
    return _done(request, fields, wid)


async def resume(request: Request) -> Response:
    checked = await _action(request)
    if isinstance(checked, Response):
        return checked
    _, fields, wid = checked
    try:
        await run_in_threadpool(_client(request).resume, wid)
    except errors.DurablyError as exc:
        return _failed(exc)
    return _done(request, fields, wid)


async def send_signal(request: Request) -> Response:
    """The Send signal form: a name and a JSON payload (empty: null), checked here."""
    checked = await _action(request)
    if isinstance(checked, Response):
        return checked
    _, fields, wid = checked
    name = (fields.get("name") or "").strip()
    if not name:
        return PlainTextResponse("give the signal's name", 422)
    text = (fields.get("payload") or "").strip() or "null"
    try:
        value = views.decode(text)
    except errors.PayloadTooDeep as exc:
        return PlainTextResponse(f"the payload is refused: {exc}", 422)
    except ValueError as exc:
        said = f'the payload is not JSON ({exc}): text goes in double quotes, as "yes"'
        return PlainTextResponse(said, 422)
    try:
        await run_in_threadpool(_client(request).send_signal, wid, name, value)
    except (errors.DurablyError, ValueError) as exc:
        return _failed(exc)
    return _done(request, fields, wid)


async def resolve(request: Request) -> Response:
    checked = await _action(request)
    if isinstance(checked, Response):
        return checked
    identity, fields, wid = checked
    seq: int = request.path_params["seq"]
    body: dict[str, Any] = {}
    choice = fields.get("decision")
    shown = fields.get("attempt") or None  # the review the form showed; refused if stale
    try:
        if choice == "retry":
            body["retry"] = True
        elif choice == "fail":
            body["fail"] = fields.get("reason") or "failed by a person"
        elif choice == "result":
            body["result"] = views.typed(fields.get("result") or "null")
        decision = api.resolution(body)
        attempt = None if shown is None else int(shown)
        await run_in_threadpool(
            lambda: _client(request).resolve(
                wid, seq, by=identity.name, attempt=attempt, **decision
            )
        )
    except (errors.DurablyError, ValueError) as exc:
        return _failed(exc)
    return _done(request, fields, wid)


# --- filters ------------------------------------------------------------------------------


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _iso(text: str | None) -> str:
    """An ISO 8601 time (as approvals record them) shown to the second, in UTC."""
    if not text:
        return ""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return text
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _ago(ts: float | None) -> str:
    if ts is None:
        return ""
    return _seconds(max(0.0, time.time() - ts)) + " ago"


def _until(ts: float | None) -> str:
    """How far off a time is: ``in 59 min``, or ``due`` once it has passed."""
    if ts is None:
        return ""
    left = ts - time.time()
    return "due" if left <= 0 else "in " + _seconds(left)


def _seconds(s: float | None) -> str:
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _count(n: int, capped: bool = False) -> str:
    """A count as the list page shows it: ``10000+`` for one that reached the cap, or a
    total with such a count in it (``api.COUNT_CAP``)."""
    return f"{n}+" if capped or n >= api.COUNT_CAP else str(n)
