"""How a route of the JSON API is declared, checked and answered.

Each route is declared once with :func:`route`, which records what the OpenAPI
document says about it (:mod:`durably.server.openapi` reads :data:`ROUTES`) and
wraps the handler with the checks every route shares: a caller who is not
authenticated gets 401, a cookie request that changes state without its CSRF
token 403, and durably's errors become JSON with a status (404 unknown workflow,
409 a conflict with the workflow's state, 422 bad input). The routes themselves
are in :mod:`durably.server.api` (reading) and :mod:`durably.server.api_changes`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

from durably import client as client_module
from durably import errors
from durably.server import auth

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
    if isinstance(exc, errors.RequestTooLarge):
        return 413
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


class SegmentRoute(Route):
    """A route whose parameters are whole path segments as the client sent them: a
    ``%2F`` in one is a '/' of its value, not a separator.

    Starlette matches the decoded path, where ``/api/workflows/orders%2F17`` is
    ``/api/workflows/orders/17``: no route (or another one, for an id like
    ``a/history``). When the raw path holds an escaped '/', this matches a path
    whose segments are decoded except for '/' and '%' (kept escaped), then decodes
    the parameters.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path")
        if scope["type"] != "http" or not isinstance(raw, bytes) or b"%2f" not in raw.lower():
            return super().matches(scope)
        path = "/".join(_kept(segment) for segment in raw.split(b"/"))
        match, child = super().matches({**scope, "path": path})
        params = child.get("path_params")
        if match != Match.NONE and isinstance(params, dict):
            child["path_params"] = {
                key: urllib.parse.unquote(value)
                if key in self.param_convertors and isinstance(value, str)
                else value
                for key, value in params.items()
            }
        return match, child


def _kept(segment: bytes) -> str:
    """A raw path segment decoded, but for its '%' and '/' (escaped again)."""
    text = urllib.parse.unquote_to_bytes(segment).decode("utf-8", "replace")
    return text.replace("%", "%25").replace("/", "%2F")


def raw_path(request: Request) -> str:
    """The request's path as the client sent it (an id's '/' still ``%2F``): the
    decoded ``request.url.path`` would lead elsewhere once sent back as a link."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1") if isinstance(raw, bytes) and raw else request.url.path


def starlette_routes() -> list[Route]:
    """The Starlette routes of every declared API route."""
    return [
        SegmentRoute(
            spec.path, _endpoint(spec, handler), methods=[spec.method], name=handler.__name__
        )
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
    except RecursionError:  # nested deeper than the decoder follows: bad input, not a 500
        raise BadInput("the request body is JSON nested too deep") from None
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


def query_limit(request: Request, default: int) -> int:
    """The ``limit`` query parameter, 1 to ``MAX_LIMIT`` (``default`` without it);
    BadInput otherwise."""
    limit: int | None = query_number(request, "limit", int)
    limit = default if limit is None else limit
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"the query parameter 'limit' must be between 1 and {MAX_LIMIT}")
    return limit


def query_text(request: Request, key: str) -> str | None:
    """A text query parameter, or None when absent or empty."""
    return request.query_params.get(key) or None


#: The path of one workflow, the stem of the routes about it.
WORKFLOW_PATH = "/api/workflows/{workflow_id}"
