"""The ASGI application of ``durably serve``: the JSON API, its OpenAPI document, the dashboard.

One :class:`~durably.Client` serves every request (its store thread runs
the reads and writes in turn); any number of these processes may serve the
same database, as the dashboard keeps no state of its own.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from importlib import metadata
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durably import client as client_module
from durably import errors
from durably.server import api, auth, dashboard, limits, openapi

HERE = Path(__file__).parent


def create_app(
    database: str,
    tokens: Sequence[auth.Token],
    *,
    max_body_bytes: int = limits.DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The app serving ``database`` to holders of ``tokens`` (at least one).

    A request body over ``max_body_bytes`` is refused with 413 before it is read
    whole (:class:`~durably.server.limits.BodyLimit`).
    """
    checker = auth.Auth(tokens)
    limits.check(max_body_bytes)
    client = client_module.Client(database)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client.open()
        try:
            yield
        finally:
            client.close()

    async def openapi_json(request: Request) -> JSONResponse:
        return JSONResponse(openapi.document(_version()))

    routes: list[BaseRoute] = [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *api.starlette_routes(),
        *dashboard.routes(),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    # SecurityHeaders outermost: a 413 of BodyLimit carries the headers too
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(limits.BodyLimit, max_bytes=max_body_bytes),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.client = client
    app.state.auth = checker
    app.state.templates = dashboard.templates()
    return app


HEADERS = [
    # Only our own scripts and styles, and no framing: an Approve button cannot be
    # clicked through another site's page.
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds :data:`HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def tokens_for(host: str, token_file: str | None) -> tuple[list[auth.Token], str | None]:
    """The tokens to serve with, and a token made up for this run if none was configured.

    Off loopback a configured token is required (ServerConfigError otherwise);
    on loopback without one, a random token is made and must be shown to the user.
    """
    tokens = auth.load_tokens(token_file)
    if tokens:
        return tokens, None
    if not auth.is_loopback(host):
        raise errors.ServerConfigError(
            f"refusing to serve on {host}, which is not a loopback address, without an API "
            f"token: set {auth.TOKEN_ENV} or pass --token-file"
        )
    made = secrets.token_urlsafe(24)
    return [auth.Token(made)], made


def _version() -> str:
    try:
        return metadata.version("durably")
    except metadata.PackageNotFoundError:
        return "0"
