"""Streamed OpenAI Agents SDK model calls (``Runner.run_streamed``) as durable steps.

The model step consumes the wrapped model's stream and journals the response
of its ``response.completed`` event, as a call that was not streamed is
journaled. The step runs in a task while the SDK iterates, so the events of a
call made now reach the SDK (and ``stream_events()``) live. A call served from
the journal yields one ``response.completed`` event of the recorded response,
whose ``metadata["durably"]`` is ``"replayed"``; the SDK's run item events
follow it as for a live call. A call asked again after a crash (or retried
after a failure mid-stream) is streamed again from its start.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents import ModelResponse, ModelSettings
from agents.exceptions import ModelBehaviorError
from agents.usage import Usage
from openai.types.responses import Response, ResponseCompletedEvent

from durably import context, errors
from durably.agents import completions

JSON = dict[str, Any]
_END = object()
#: The events that end a Responses API stream; a stream without one was cut short.
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def with_key(model_settings: ModelSettings) -> ModelSettings:
    """The settings with the step's idempotency key as a header, the same on every attempt."""
    headers = dict(model_settings.extra_headers or {})
    headers.setdefault(completions.IDEMPOTENCY_HEADER, context.idempotency_key())
    return dataclasses.replace(model_settings, extra_headers=headers)


async def journaled(
    open_stream: Callable[[], AsyncIterator[Any]],
    turn: Callable[[Callable[[], Awaitable[JSON]]], Awaitable[JSON]],
    record_of: Callable[[ModelResponse], JSON],
    replayed: Callable[[JSON], ResponseCompletedEvent],
) -> AsyncIterator[Any]:
    """The events of one streamed model call whose response is journaled by ``turn``.

    ``open_stream`` opens the wrapped model's stream (inside the step);
    ``record_of`` makes the journal record of its response; ``replayed`` the
    event standing for a record served from the journal.
    """
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def stream_step() -> JSON:
        completed: Response | None = None
        ended = False  # a terminal event came: the stream was not cut short
        async for event in open_stream():
            queue.put_nowait(event)
            ended = ended or getattr(event, "type", None) in _TERMINAL
            if isinstance(event, ResponseCompletedEvent):
                completed = event.response
        if not ended:  # retried, as a connection that broke off would be
            raise ConnectionError("the model's stream ended before its final event")
        if completed is None:
            raise ModelBehaviorError("the model's stream ended without a response.completed event")
        return record_of(model_response(completed))

    task = asyncio.ensure_future(turn(stream_step))
    task.add_done_callback(lambda _: queue.put_nowait(_END))
    fed = False
    try:
        while (item := await queue.get()) is not _END:
            fed = True
            yield item
        record = await task  # the step's error, if any, is the SDK's
        if not fed:
            yield replayed(record)
    finally:
        if not task.done():  # the SDK stopped early: the step still ends
            await task


def model_response(response: Response) -> ModelResponse:
    """The SDK's ModelResponse of a streamed call's final ``Response``, as its run loop makes it."""
    u = response.usage
    used = Usage()
    if u is not None:
        used = Usage(
            requests=1,
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            total_tokens=u.total_tokens,
            input_tokens_details=u.input_tokens_details,
            output_tokens_details=u.output_tokens_details,
        )
    return ModelResponse(output=list(response.output), usage=used, response_id=response.id)


def replayed_event(recorded: ModelResponse, model: str) -> ResponseCompletedEvent:
    """The ``response.completed`` event standing for a journaled call, marked replayed."""
    u = recorded.usage
    data = {
        "id": recorded.response_id or "resp_durably_replayed",
        "object": "response",
        "created_at": 0,
        "model": model or "unknown",
        "output": [item.model_dump(mode="json", exclude_none=True) for item in recorded.output],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
        "metadata": {"durably": "replayed"},
        "usage": {
            "input_tokens": u.input_tokens,
            "input_tokens_details": u.input_tokens_details.model_dump(mode="json"),
            "output_tokens": u.output_tokens,
            "output_tokens_details": u.output_tokens_details.model_dump(mode="json"),
            "total_tokens": u.total_tokens,
        },
    }
    try:
        response = Response.model_validate(data)
    except ValueError as exc:
        raise errors.DecodeError(
            f"a journaled model call is not a Responses API one: {exc}"
        ) from exc
    return ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)
