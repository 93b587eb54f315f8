"""The fake model server's Anthropic Messages API: whole answers and server-sent events.

Split out of :mod:`durably.testing.models` (which routes ``POST /v1/messages``
here). :func:`build_message` makes the ``Message`` JSON of a scripted reply;
:func:`stream_events` the server-sent events Anthropic sends for the same
message when the request asks ``"stream": true``, in the API's order::

    message_start, then per content block: content_block_start,
    content_block_delta (text_delta pieces, or input_json_delta halves of a
    tool_use's input), content_block_stop; then message_delta (stop reason and
    output tokens) and message_stop.

The whole message is logged before the first event is sent, so a client killed
mid-stream still left its request in the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

JSON = dict[str, Any]

#: Characters of text per ``text_delta`` event.
PIECE = 8


def build_message(
    *,
    content_text: str | None,
    calls: list[tuple[str, str, Mapping[str, Any] | str]],
    counted: JSON,
    cache_write: int,
    stop: str | None,
    model: str,
    n: int,
) -> JSON:
    """A Messages API answer: text and tool_use blocks, a stop reason, cache usage.

    ``calls`` are (id, name, arguments) of the reply's tool calls; ``counted``
    the chat-completions-shaped usage the server computed for the reply.
    """
    content: list[JSON] = []
    if content_text is not None:
        content.append({"type": "text", "text": content_text})
    for call_id, name, arguments in calls:
        given = json.loads(arguments or "{}") if isinstance(arguments, str) else dict(arguments)
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": given})
    read = counted["prompt_tokens_details"]["cached_tokens"]
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(0, counted["prompt_tokens"] - read - cache_write),
            "output_tokens": counted["completion_tokens"],
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": cache_write,
        },
    }


def error_body(message: str, status: int) -> JSON:
    """An Anthropic-style error answer."""
    kind = {
        400: "invalid_request_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def stream_events(message: Mapping[str, Any]) -> Iterator[tuple[str, JSON]]:
    """The (event name, data) pairs of a streamed ``message``, in the API's order."""
    usage = dict(message.get("usage") or {})
    start_usage = {**usage, "output_tokens": 1}
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    yield "message_start", {"type": "message_start", "message": {**head, "usage": start_usage}}
    for index, block in enumerate(message.get("content") or ()):
        if block.get("type") == "text":
            yield _block_start(index, {"type": "text", "text": ""})
            text = str(block.get("text") or "")
            for i in range(0, len(text), PIECE):
                yield _delta(index, {"type": "text_delta", "text": text[i : i + PIECE]})
        else:
            yield _block_start(index, {**block, "input": {}})
            arguments = json.dumps(block.get("input") or {})
            half = len(arguments) // 2
            for part in (arguments[:half], arguments[half:]):
                yield _delta(index, {"type": "input_json_delta", "partial_json": part})
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    final_usage = {"output_tokens": usage.get("output_tokens", 0)}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": final_usage}
    yield "message_stop", {"type": "message_stop"}


def _block_start(index: int, block: JSON) -> tuple[str, JSON]:
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": block,
    }


def _delta(index: int, delta: JSON) -> tuple[str, JSON]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
