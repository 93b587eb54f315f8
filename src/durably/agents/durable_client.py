"""``durably.llm(client)``: the client's own API, where every ``create()`` is a durable step.

An OpenAI client gets ``llm.chat.completions.create``; an Anthropic client
``llm.messages.create`` (returning ``anthropic.types.Message``).

For hand-written agent loops. ``await llm.chat.completions.create(model=...,
messages=...)`` takes a seq in program order like any step call, journals the
response (never the request) and returns a ``ChatCompletion``; on replay the
journaled response comes back without a request to the provider.

The call is always awaited, whether the client is ``OpenAI`` or ``AsyncOpenAI``:
a durable call in a workflow is awaited like every step, and a sync client's
request runs in a step thread so the event loop never blocks. With
``stream=True`` the awaited value is a :class:`~durably.agents.streams.DurableStream`
of chunks delivered while the step runs; the journal keeps the assembled
completion, and a replayed turn yields its recorded message once, with
``stream.replayed`` True. An Anthropic client's ``messages.create(stream=True)``
awaits a :class:`~durably.agents.streams.DurableMessageStream` of its
server-sent events, journaled the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from durably import steps
from durably.agents import budget, completions, messages_api, streams, usage

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion


class DurableCompletions:
    """``llm.chat.completions``: ``create()`` as a durable step."""

    def __init__(self, owner: DurableLLM) -> None:
        self._owner = owner

    def create(self, **params: Any) -> Coroutine[Any, Any, Any]:
        """Make (or replay) one chat completion; await the ``ChatCompletion``.

        Takes the same keyword arguments as the client's ``create``. The seq is
        taken now, so ``asyncio.gather`` over several calls replays in order.
        With ``stream=True`` await a :class:`~durably.agents.streams.DurableStream`.
        """
        owner = self._owner
        if params.get("stream"):
            stream = streams.DurableStream()
            pending = completions.call_model(
                owner.step, params, owner.price_table, limits=owner.limits, on_chunk=stream.feed
            )
            return stream.start(pending)
        pending = completions.call_model(owner.step, params, owner.price_table, limits=owner.limits)
        return _as_completion(pending)


async def _as_completion(pending: Coroutine[Any, Any, completions.JSON]) -> ChatCompletion:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(await pending)


class DurableMessages:
    """``llm.messages`` of an Anthropic client: ``create()`` as a durable step."""

    def __init__(self, owner: DurableLLM) -> None:
        self._owner = owner

    def create(self, **params: Any) -> Coroutine[Any, Any, Any]:
        """Make (or replay) one Messages API call; await the ``anthropic.types.Message``.

        Takes the client's own keyword arguments. The journal keeps the
        provider-neutral turn (see :mod:`durably.agents.messages_api`): text and
        tool_use blocks, the stop reason, usage with cache reads and writes.
        With ``stream=True`` await a :class:`~durably.agents.streams.DurableMessageStream`
        of the server-sent events, delivered while the step runs.
        """
        owner = self._owner
        if params.get("stream"):
            stream = streams.DurableMessageStream()
            pending = completions.call_model(
                owner.step,
                params,
                owner.price_table,
                limits=owner.limits,
                native=True,
                on_chunk=stream.feed,
            )
            return stream.start(pending)
        owner = self._owner
        pending = completions.call_model(
            owner.step, params, owner.price_table, limits=owner.limits, native=True
        )
        return _as_message(pending)


async def _as_message(pending: Coroutine[Any, Any, completions.JSON]) -> Any:
    # imported by name: anthropic is an optional extra (and may be absent where mypy runs)
    message_class: Any = importlib.import_module("anthropic.types").Message
    return message_class.model_validate(messages_api.message(await pending))


class DurableChat:
    """``llm.chat``."""

    def __init__(self, owner: DurableLLM) -> None:
        self.completions = DurableCompletions(owner)


class DurableLLM:
    """An OpenAI-compatible client whose ``chat.completions.create`` calls are durable steps.

    ``retry`` defaults to :class:`~durably.agents.ModelRetry` (429/5xx with
    ``Retry-After``, other 4xx final); ``timeout`` bounds one attempt in
    seconds; ``price_table`` prices usage (see :mod:`durably.agents.usage`);
    ``idempotency_header`` names the header that carries the step's key on every
    attempt (None to send none); ``max_cost`` / ``max_tokens`` bound the model
    calls of each workflow run that uses it, counted from the journal: when
    reached the run parks for a person (see :mod:`durably.agents.budget`).
    """

    def __init__(
        self,
        client: Any,
        *,
        retry: steps.Retry | None = None,
        timeout: float | None = None,
        price_table: Mapping[str, usage.Price] | None = None,
        idempotency_header: str | None = completions.IDEMPOTENCY_HEADER,
        max_cost: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.limits = budget.Limits(max_cost, max_tokens)
        completions.warn_if_client_retries(client)
        self.client = client
        self.price_table = usage.DEFAULT_PRICES if price_table is None else price_table
        self.step = completions.model_step(
            client,
            retry=completions.ModelRetry() if retry is None else retry,
            timeout=timeout,
            idempotency_header=idempotency_header,
        )
        if messages_api.is_anthropic(client):
            self.messages = DurableMessages(self)
        else:
            self.chat = DurableChat(self)

    def __repr__(self) -> str:
        return f"<durably.llm {type(self.client).__name__}>"


def llm(
    client: Any,
    *,
    retry: steps.Retry | None = None,
    timeout: float | None = None,
    price_table: Mapping[str, usage.Price] | None = None,
    idempotency_header: str | None = completions.IDEMPOTENCY_HEADER,
    max_cost: float | None = None,
    max_tokens: int | None = None,
) -> DurableLLM:
    """Wrap an ``OpenAI`` or ``AsyncOpenAI`` client (created with ``max_retries=0``).

    ``await durably.llm(client).chat.completions.create(...)`` inside a workflow
    is a durable step; see :class:`DurableLLM` for the options.
    """
    return DurableLLM(
        client,
        retry=retry,
        timeout=timeout,
        price_table=price_table,
        idempotency_header=idempotency_header,
        max_cost=max_cost,
        max_tokens=max_tokens,
    )
