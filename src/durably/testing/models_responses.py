"""The fake model server's OpenAI Responses API: whole answers and server-sent events.

Split out of :mod:`durably.testing.models` (which routes ``POST /v1/responses``
here). :func:`build_response` makes the ``Response`` JSON of a scripted reply;
:func:`stream_events` the server-sent events the API sends for the same
response when the request asks ``"stream": true``::

    response.created, then per output item: response.output_item.added,
    (for a message) response.output_text.delta pieces and
    response.output_text.done, (for a function call)
    response.function_call_arguments.delta halves and ...done,
    response.output_item.done; then response.completed with the whole response.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

JSON = dict[str, Any]

#: Characters of text per ``response.output_text.delta`` event.
PIECE = 8


def build_response(
    *,
    content_text: str | None,
    calls: list[tuple[str, str, str]],
    counted: JSON,
    model: str,
    instructions: Any,
    n: int,
    created: int,
) -> JSON:
    """A Responses API answer: the reply's text as a message, its calls as function calls.

    ``calls`` are (call id, name, arguments JSON text); ``counted`` the
    chat-completions-shaped usage the server computed for the reply.
    """
    output: list[JSON] = []
    if content_text is not None:
        text_part = {"type": "output_text", "text": content_text, "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_fake_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [text_part],
            }
        )
    for i, (call_id, name, arguments) in enumerate(calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_fake_{n}_{i}",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    return {
        "id": f"resp_fake_{n}",
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": instructions,
        "metadata": {},
        "usage": {
            "input_tokens": counted["prompt_tokens"],
            "output_tokens": counted["completion_tokens"],
            "total_tokens": counted["total_tokens"],
            "input_tokens_details": counted["prompt_tokens_details"],
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def stream_events(response: Mapping[str, Any]) -> Iterator[tuple[str, JSON]]:
    """The (event name, data) pairs of a streamed ``response``, in the API's order."""
    seq = 0

    def event(kind: str, **data: Any) -> tuple[str, JSON]:
        nonlocal seq
        seq += 1
        return kind, {"type": kind, "sequence_number": seq - 1, **data}

    head = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=head)
    for index, item in enumerate(response.get("output") or ()):
        if item.get("type") == "message":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            text = str(item["content"][0]["text"])
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            for i in range(0, len(text), PIECE):
                piece = text[i : i + PIECE]
                yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
            yield event("response.output_text.done", **where, text=text, logprobs=[])
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            yield event("response.output_item.added", output_index=index, item=added)
            arguments = str(item.get("arguments") or "")
            half = len(arguments) // 2
            where = {"item_id": item["id"], "output_index": index}
            for part in (arguments[:half], arguments[half:]):
                yield event("response.function_call_arguments.delta", **where, delta=part)
            yield event("response.function_call_arguments.done", **where, arguments=arguments)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=dict(response))
