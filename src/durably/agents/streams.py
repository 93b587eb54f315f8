"""``durably.llm(client).chat.completions.create(..., stream=True)``: a stream over a durable step.

The model step consumes the provider's stream and journals the assembled
completion, as for ``Agent(stream=True)``; :class:`DurableStream` hands each
chunk to the caller while that step runs. Chunks are delivered live only: a
turn whose completion comes from the journal (a replay after a crash or a
park) yields one chunk carrying its whole recorded message (text, tool calls,
finish reason, usage), and ``stream.replayed`` is True. A turn asked again
after a crash is streamed again, from its start. The journal keeps one entry
per turn whatever was streamed.

Why a separate task: the step must run while the caller iterates, so awaiting
``create()`` starts the step in a task (its seq was taken at the call, in
program order) and the iterator drains a queue the step feeds. Chunks of a
sync client arrive from the step's thread and are handed to the event loop.

:class:`DurableMessageStream` is the same over Anthropic's Messages API
(``llm(AsyncAnthropic()).messages.create(stream=True)``): it yields the
server-sent events, and a replayed turn yields the events of its recorded
message once.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from durably.agents import messages_api

JSON = dict[str, Any]

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

_END = object()


class DurableStream:
    """The chunks of one durable chat completion, as ``ChatCompletionChunk`` objects.

    ``async for chunk in stream`` (or ``async with stream:`` around it, which
    waits for the step to end even when the loop stops early). ``replayed`` is
    True when the turn came from the journal; ``completion`` is the assembled
    ``ChatCompletion`` once the stream has ended.
    """

    def __init__(self) -> None:
        self.replayed = False
        self.completion: ChatCompletion | None = None
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._task: asyncio.Future[JSON] | None = None
        self._fed = False
        self._done = False
        self._replay: list[JSON] = []  # what is left to yield of a turn from the journal

    def feed(self, chunk: JSON) -> None:
        """Take one chunk from the model step (from its thread, for a sync client)."""
        self._fed = True
        if self._loop is None or threading.get_ident() == self._thread:
            self._queue.put_nowait(chunk)
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, chunk)

    async def start(self, pending: Coroutine[Any, Any, JSON]) -> DurableStream:
        """Run the step (``pending``) in a task and return this stream to iterate."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._task = asyncio.ensure_future(pending)
        self._task.add_done_callback(lambda _: self._queue.put_nowait(_END))
        return self

    def __aiter__(self) -> DurableStream:
        return self

    async def __anext__(self) -> Any:
        if self._replay:
            return self._item(self._replay.pop(0))
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is not _END:
            return self._item(cast(JSON, item))
        assert self._task is not None
        self._done = True
        response = await self._task  # the step's error, if any, is the caller's
        self._finish(response)
        if self._fed:
            raise StopAsyncIteration
        self.replayed = True
        self._replay = self._replayed_items(response)
        return self._item(self._replay.pop(0))

    async def __aenter__(self) -> DurableStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None and not self._done:
            response = await self._task
            self._done = True
            self._finish(response)

    # --- what differs by provider ------------------------------------------------------

    def _item(self, chunk: JSON) -> Any:
        """One chunk as the provider's object (``ChatCompletionChunk``)."""
        from openai.types.chat import ChatCompletionChunk

        return ChatCompletionChunk.model_validate(chunk)

    def _replayed_items(self, response: JSON) -> list[JSON]:
        """What a turn from the journal yields: one chunk with the whole message."""
        return [whole_chunk(response)]

    def _finish(self, response: JSON) -> None:
        from openai.types.chat import ChatCompletion

        self.completion = ChatCompletion.model_validate(response)


class DurableMessageStream(DurableStream):
    """The server-sent events of one durable Anthropic Messages API turn.

    ``async for event in stream`` yields ``anthropic.types.RawMessageStreamEvent``
    objects (``message_start``, ``content_block_*``, ``message_delta``,
    ``message_stop``). A turn from the journal yields that same sequence once,
    each block whole (its text in one ``text_delta``), with ``stream.replayed``
    True. ``message`` is the assembled ``anthropic.types.Message`` once the
    stream has ended.
    """

    def __init__(self) -> None:
        super().__init__()
        self.message: Any = None

    def _item(self, chunk: JSON) -> Any:
        return _event_adapter().validate_python(chunk)

    def _replayed_items(self, response: JSON) -> list[JSON]:
        return messages_api.replay_events(response)

    def _finish(self, response: JSON) -> None:
        message_class: Any = importlib.import_module("anthropic.types").Message
        self.message = message_class.model_validate(messages_api.message(response))


@functools.cache
def _event_adapter() -> Any:
    import pydantic

    # imported by name: anthropic is an optional extra (and may be absent where mypy runs)
    event: Any = importlib.import_module("anthropic.types").RawMessageStreamEvent
    return pydantic.TypeAdapter(event)


def whole_chunk(response: JSON) -> JSON:
    """One chunk carrying a journaled completion's whole first message."""
    choices = response.get("choices") or [{}]
    message = choices[0].get("message") or {}
    delta: JSON = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    chunk: JSON = {
        "id": response.get("id") or "",
        "object": "chat.completion.chunk",
        "created": response.get("created") or 0,
        "model": response.get("model") or "",
        "choices": [{"index": 0, "delta": delta, "finish_reason": choices[0].get("finish_reason")}],
    }
    if response.get("usage"):
        chunk["usage"] = response["usage"]
    return chunk
