"""The fake model server's chat completions wire format: errors and streamed chunks.

Split out of :mod:`durably.testing.models`. :func:`stream_chunks` makes the
server-sent chunks of one completion when the request asks ``"stream": true``:
the role, the content in pieces, each tool call in two halves, the finish
reason and, when ``stream_options.include_usage`` asks, a usage chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

JSON = dict[str, Any]

#: Characters of content per chunk.
PIECE = 8


def error_body(message: str, status: int) -> JSON:
    """An OpenAI-style error answer."""
    kind = {429: "rate_limit_exceeded", 400: "invalid_request_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


def stream_chunks(completion: JSON, include_usage: bool) -> Iterator[JSON]:
    """The server-sent chunks of one completion: role, content pieces, tool calls, finish."""
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: JSON, finish: str | None = None) -> JSON:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    content = message.get("content") or ""
    for i in range(0, len(content), PIECE):
        yield chunk({"content": content[i : i + PIECE]})
    for index, tc in enumerate(message.get("tool_calls") or ()):
        args = tc["function"]["arguments"]
        half = len(args) // 2
        first = {"name": tc["function"]["name"], "arguments": args[:half]}
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": tc["id"], "type": "function", "function": first}
                ]
            }
        )
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": args[half:]}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": completion["usage"]}
