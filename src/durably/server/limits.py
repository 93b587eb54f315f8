"""The largest request body ``durably serve`` reads: larger ones are refused with 413.

Without a limit, a POST of any size (a start, a signal, a login form) is read into
memory whole before anything looks at it. :class:`BodyLimit` refuses a body that
declares a ``Content-Length`` over the limit before reading any of it, and counts
the bytes of one that declares none (chunked) as they arrive, refusing it the moment
the count passes the limit: no more than the limit (and one chunk) is ever held.
"""

from __future__ import annotations

import logging

from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durably import errors
from durably.server import routing

#: The default limit: far more than any request of the API or the dashboard needs
#: (a start's arguments, a signal's payload, a form), far less than a memory worry.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

log = logging.getLogger("durably.server")


class BodyLimit:
    """ASGI middleware refusing a request body over ``max_bytes`` with 413.

    The API (``/api/...``) answers with its JSON error, the dashboard's pages with a
    plain message. The answer closes the connection, so the rest of the body is not
    read either.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = check(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, f"{declared} bytes declared")
            return
        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            if over:  # a handler that caught the error and reads on: still too large
                raise errors.RequestTooLarge(self.message())
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise errors.RequestTooLarge(self.message())
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # a handler answered the error itself: close as ours does
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except errors.RequestTooLarge:
            if started:  # an answer under way cannot become a 413; the server ends it
                return
            await self._refuse(scope, receive, send, f"over {self.max_bytes} bytes received")

    def message(self) -> str:
        """What the 413 says: the limit, never anything of the request."""
        return (
            f"the request body is larger than this server accepts ({self.max_bytes} bytes; "
            "durably serve --max-body-bytes)"
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, seen: str) -> None:
        # the method and path only: no query string, header or byte of the body is logged
        log.warning(
            "refused a request body larger than %d bytes (%s): %s %s",
            self.max_bytes,
            seen,
            scope.get("method", ""),
            scope.get("path", ""),
        )
        response: Response
        if scope.get("path", "").startswith("/api/"):
            response = routing.error(413, errors.RequestTooLarge.__name__, self.message())
        else:
            response = PlainTextResponse(self.message(), 413)
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def check(max_bytes: int) -> int:
    """``max_bytes`` if it is a limit a server can serve with (an int of at least 1)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise errors.ServerConfigError(
            f"max_body_bytes must be a whole number of bytes of at least 1, not {max_bytes!r}"
        )
    return max_bytes


def _content_length(scope: Scope) -> int | None:
    """The length the request declares, or None (chunked, or no valid header: counted)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None
