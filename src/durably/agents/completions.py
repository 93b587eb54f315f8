"""Model calls as durable steps: one chat completion per step, retried by the engine.

A model call is a step named ``llm:chat.completions`` whose result is the
response as plain JSON (``ChatCompletion.model_dump``): the assistant message,
the finish reason and the usage. Never the request: the messages sent are
rebuilt on replay from earlier journaled turns and tool results, so a long
conversation costs linear storage.

The engine owns retries. Clients are expected with ``max_retries=0`` (a client
that retries on its own does so invisibly inside one step; we warn). A 429,
408, 409 or 5xx answer and connection errors are retried with durable back-off,
honouring ``Retry-After`` (capped); any other 4xx is final. Every attempt of one
call carries the same ``Idempotency-Key`` header (the step's key), so a gateway
that deduplicates can tell a retry from a new request.
"""

from __future__ import annotations

import dataclasses
import email.utils
import inspect
import sys
import time
import warnings
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from durably import context, errors, steps, telemetry, validate
from durably.agents import budget, events, exceptions, messages_api, usage

STEP_NAME = usage.MODEL_STEP_PREFIX + "chat.completions"
IDEMPOTENCY_HEADER = "Idempotency-Key"
_RETRY_STATUSES = frozenset({408, 409, 429})

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ModelRetry(steps.Retry):
    """The retry policy of model calls: transient failures only, honouring ``Retry-After``.

    Retried: HTTP 408, 409, 429 and 5xx answers, connection errors and step
    timeouts. Not retried: every other 4xx (a bad request stays bad). When the
    answer carries ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP
    date) that delay is used, capped at ``max_retry_after``; otherwise the usual
    exponential back-off. The wait is a durable timer like any step retry.
    """

    max_attempts: int = 6
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        steps.Retry.__post_init__(self)
        validate.number(self.max_retry_after, "max_retry_after", error=errors.DefinitionError)

    def delay_after(self, attempt: int, exc: BaseException) -> float | None:
        """Seconds before the next attempt, or None when ``exc`` is final."""
        if attempt >= self.max_attempts or not is_transient(exc):
            return None
        if not isinstance(exc, self.retry_on) or isinstance(exc, self.dont_retry_on):
            return None
        hinted = retry_after(exc)
        if hinted is not None:
            return min(hinted, self.max_retry_after)
        return steps.Retry.delay_after(self, attempt, exc)


def is_transient(exc: BaseException) -> bool:
    """Whether a model call that raised ``exc`` may succeed if tried again."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        if status < 400:  # an error event inside a stream answered 200: its type says
            return _error_type(exc) in _TRANSIENT_TYPES
        return status in _RETRY_STATUSES or status >= 500
    if isinstance(exc, errors.StepTimeout | ConnectionError | TimeoutError):
        return True
    for provider in ("openai", "anthropic"):
        module = sys.modules.get(provider)
        if module is not None and isinstance(exc, module.APIConnectionError):
            return True
    # Pydantic AI raises its own for the client's connection errors and timeouts
    pydantic_ai = sys.modules.get("pydantic_ai.exceptions")
    connection = getattr(pydantic_ai, "ModelConnectionError", None)
    return isinstance(connection, type) and isinstance(exc, connection)


#: The error types Anthropic sends as an ``error`` event after a 200 that a new request may cure.
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def _error_type(exc: BaseException) -> str | None:
    """The ``error.type`` of the body a provider's error carries (``overloaded_error``)."""
    body = getattr(exc, "body", None)
    error = body.get("error") if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if isinstance(kind, str) else None


def retry_after(exc: BaseException, now: Callable[[], float] = time.time) -> float | None:
    """The delay the server asked for in ``retry-after-ms`` or ``Retry-After``, in seconds.

    The headers are the response's (the openai and anthropic clients' errors), or the
    error's own (Pydantic AI's ``ModelHTTPError``, whose keys are lowercased).
    """
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        headers = getattr(exc, "headers", None)
    if headers is None:
        return None
    millis = _header(headers, "retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


def _header(headers: Any, name: str) -> str | None:
    value = headers.get(name)
    if value is None and isinstance(headers, Mapping):
        value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    return None if value is None else str(value)


def warn_if_client_retries(client: Any) -> None:
    """Warn when an OpenAI-style client would retry on its own, inside one durable step."""
    retries = getattr(client, "max_retries", 0)
    if isinstance(retries, int) and retries > 0:
        warnings.warn(
            f"{type(client).__name__}(max_retries={retries}) retries on its own, inside one "
            "durable step and invisibly to the journal; create it with max_retries=0 so "
            "durably owns retries (durable back-off, Retry-After honoured, 4xx not retried)",
            exceptions.ClientRetriesWarning,
            stacklevel=3,
        )


def is_async_client(client: Any) -> bool:
    """True for ``AsyncOpenAI`` / ``AsyncAnthropic``-style clients (``create`` is a coroutine)."""
    return inspect.iscoroutinefunction(inspect.unwrap(_create_of(client)))


def _create_of(client: Any) -> Any:
    if messages_api.is_anthropic(client):
        return client.messages.create
    return client.chat.completions.create


# --- the step ------------------------------------------------------------------------


@dataclasses.dataclass(init=False, eq=False)
class Call:
    """One model call in flight: ``live`` is set when its step body ran in this process.

    The model step commits an intent before each request, so a request cut off
    by a crash leaves a trace and the next attempt's number counts it; an
    answer that took more than one attempt is journaled with that number
    (:data:`ATTEMPT_KEY`), so usage and budgets count the earlier requests the
    same way live and on replay. Only ``model`` is a dataclass field, so the
    intent records the model's name and never the conversation. ``limits`` and
    ``prices`` are the caller's budget (checked before a repeated request).
    """

    model: str

    def __init__(
        self,
        params: JSON,
        limits: budget.Limits | None = None,
        prices: Mapping[str, usage.Price] | None = None,
    ) -> None:
        self.model = str(params.get("model") or "")
        self.params: JSON = params
        self.native = False  # params already in the provider's own shape (llm() on Anthropic)
        self.on_delta: Callable[[str], None] | None = None  # streamed text, live only
        self.on_chunk: Callable[[JSON], None] | None = None  # streamed chunks, live only
        self.live = False
        self.limits = limits
        self.prices: Mapping[str, usage.Price] = usage.DEFAULT_PRICES if prices is None else prices


#: Where a model step's result notes the attempts it took, when more than one.
ATTEMPT_KEY = "_durably_attempt"


def lost_answer(key: str, *_: Any) -> Any:
    """The model step's ``reconcile``: an interrupted request is asked again with its key.

    A provider keeps no record we could look up, so the answer is always
    NotFound. The step's intent exists so the attempt is counted.
    """
    return steps.NotFound


def earlier_requests(result: Any) -> int:
    """How many requests before the answer a crash lost (``noted``), the mark taken off."""
    attempts = result.pop(ATTEMPT_KEY, 1) if isinstance(result, dict) else 1
    return max(0, attempts - 1) if isinstance(attempts, int) else 0


def noted(result: JSON) -> JSON:
    """The step's result, with the attempt number when earlier requests were made."""
    step = context.current_step.get()
    if step is None or step.attempt <= 1:
        return result
    return {**result, ATTEMPT_KEY: step.attempt}


def model_step(
    client: Any,
    *,
    retry: steps.Retry | None,
    timeout: float | None,
    idempotency_header: str | None,
    name: str = STEP_NAME,
) -> steps.StepFunction[[Call], JSON]:
    """The step that sends one ``Call`` with ``client`` and returns the response as JSON.

    The body runs only when the journal has no result for the call, so it is
    where a call is known to be billed. With ``stream=True`` in the params the
    stream (chat completion chunks, or the Messages API's server-sent events)
    is consumed inside the step and journaled as one completion.
    """
    anthropic = messages_api.is_anthropic(client)
    system = "anthropic" if anthropic else "openai"  # gen_ai.system of its spans
    create = _create_of(client)

    def request(call: Call) -> JSON:
        step = context.current_step.get()
        attempt = step.attempt if step is not None else 1
        budget.refuse_if_reached(call.limits, call.params, attempt, call.prices)
        params = dict(call.params)
        if anthropic:
            params = params if call.native else messages_api.request(params)
        elif params.get("stream"):
            options = dict(params.get("stream_options") or {})
            options.setdefault("include_usage", True)
            params["stream_options"] = options
        step = context.current_step.get()
        if idempotency_header and step is not None:  # None: a plain call outside a workflow
            headers = dict(params.get("extra_headers") or {})
            headers.setdefault(idempotency_header, step.idempotency_key)
            params["extra_headers"] = headers
        return params

    assemble_chunks = messages_api.assemble if anthropic else assemble

    def join(chunks: list[JSON]) -> JSON:
        """A stream's chunks as one answer; ConnectionError (retried) when it was cut short.

        A stream whose connection closes before its last event ends without an
        error from the client, so its first words would be journaled as the answer.
        """
        if not _finished(chunks, anthropic):
            raise ConnectionError(
                f"the model's stream ended after {len(chunks)} chunk(s), before its final one"
            )
        return assemble_chunks(chunks)

    def answered(call: Call, result: JSON, span: Any) -> JSON:
        """The provider answered: the call is billed, and its turn is what the step returns."""
        call.live = True
        answer = messages_api.turn(result) if anthropic else result
        telemetry.record_result(span, name, answer)
        return noted(answer)

    if is_async_client(client):

        async def call_async(call: Call) -> JSON:
            params = request(call)
            with telemetry.model_span(system, call.model) as span:
                response = await create(**params)
                if params.get("stream"):
                    async with response as stream:
                        chunks = [_seen(call, _dump(chunk)) async for chunk in stream]
                    return answered(call, join(chunks), span)
                return answered(call, _dump(response), span)

        return steps.step(name=name, retry=retry, timeout=timeout, reconcile=lost_answer)(
            call_async
        )

    def call_sync(call: Call) -> JSON:
        params = request(call)
        with telemetry.model_span(system, call.model) as span:
            response = create(**params)
            if params.get("stream"):
                with response as stream:
                    chunks = [_seen(call, _dump(chunk)) for chunk in stream]
                return answered(call, join(chunks), span)
            return answered(call, _dump(response), span)

    return steps.step(name=name, retry=retry, timeout=timeout, reconcile=lost_answer)(call_sync)


def _finished(chunks: Iterable[Mapping[str, Any]], anthropic: bool) -> bool:
    """Whether a stream reached its end: a ``message_stop`` event, or a finish reason or usage.

    Usage (asked with ``include_usage``) comes in the last chunk, so a provider
    that never sends a finish reason is not taken for a stream cut short.
    """
    if anthropic:
        return any(chunk.get("type") == "message_stop" for chunk in chunks)
    return any(
        chunk.get("usage") or any(c.get("finish_reason") for c in chunk.get("choices") or ())
        for chunk in chunks
    )


def _seen(call: Call, chunk: JSON) -> JSON:
    """Pass a streamed chunk (or its text) to the caller (live), and keep the chunk."""
    if call.on_chunk is not None:
        call.on_chunk(chunk)
    if call.on_delta is not None:
        piece = events.delta_text(chunk)
        if piece:
            call.on_delta(piece)
    return chunk


def _dump(response: Any) -> JSON:
    """A response object as the JSON the server sent (fields it did not send left out)."""
    if isinstance(response, dict):
        return response
    dumped: JSON = response.model_dump(mode="json", exclude_unset=True)
    return dumped


def assemble(chunks: Iterable[Mapping[str, Any]]) -> JSON:
    """One chat completion (as JSON) from the chunks of a streamed one."""
    out: JSON = {"id": "", "object": "chat.completion", "created": 0, "model": "", "choices": []}
    by_index: dict[int, JSON] = {}
    for chunk in chunks:
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) and not out.get(key):
                out[key] = chunk[key]
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or ():
            slot = by_index.setdefault(
                int(choice.get("index") or 0),
                {"content": "", "refusal": "", "calls": {}, "finish_reason": None},
            )
            delta = choice.get("delta") or {}
            slot["content"] += delta.get("content") or ""
            slot["refusal"] += delta.get("refusal") or ""
            for part in delta.get("tool_calls") or ():
                call = slot["calls"].setdefault(
                    int(part.get("index") or 0),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            slot["finish_reason"] = choice.get("finish_reason") or slot["finish_reason"]
    for index, slot in sorted(by_index.items()):
        message: JSON = {"role": "assistant", "content": slot["content"] or None}
        if slot["refusal"]:
            message["refusal"] = slot["refusal"]
        if slot["calls"]:
            message["tool_calls"] = [slot["calls"][i] for i in sorted(slot["calls"])]
        finish = slot["finish_reason"] or "stop"
        out["choices"].append({"index": index, "message": message, "finish_reason": finish})
    return out


def call_model(
    step: steps.StepFunction[[Call], JSON],
    params: JSON,
    prices: Mapping[str, usage.Price],
    *meters: usage.Meter,
    limits: budget.Limits | None = None,
    native: bool = False,
    on_text: Callable[[str, bool], None] | None = None,
    on_chunk: Callable[[JSON], None] | None = None,
) -> Coroutine[Any, Any, JSON]:
    """Take the model call's seq now (program order) and return the awaitable that makes it.

    When it returns, the call is counted as billed (its body ran here) or
    replayed (its response came from the journal) in ``meters`` and in the
    current workflow run's tally. With ``limits`` the run's budget is checked
    first (see :mod:`durably.agents.budget`): the seq is then taken once the
    budget allows the call, and a call the step refused is made again at a new
    seq after a person raised the budget. ``native`` says ``params`` are
    already in the provider's own shape (``llm()`` on an Anthropic client).
    ``on_text(text, replayed)`` gets a streamed turn's text as it arrives, or
    the turn's whole text once it ends (``replayed`` when from the journal);
    ``on_chunk`` each chunk of a streamed turn as it arrives (live only, called
    from the step's thread for a sync client).
    """

    if context.current_run.get() is not None and context.current_step.get() is not None:
        raise errors.NotInWorkflow(
            "a durable model call was made inside a step (a tool or @durably.step): it "
            "cannot be journaled there, and would be asked again on every retry or recovery "
            "of that step. Make the call from the workflow's own code, or call the client "
            "itself inside the step if asking again is what you want."
        )

    def new_call(with_limits: budget.Limits | None) -> Call:
        call = Call(params, with_limits, prices)
        call.native = native
        if on_text is not None and params.get("stream"):
            call.on_delta = lambda piece: on_text(piece, False)
        call.on_chunk = on_chunk
        return call

    if limits is None or not limits.set or context.current_run.get() is None:
        return _made(step, new_call(None), prices, meters, on_text)

    async def budgeted() -> JSON:
        while True:
            await budget.ensure(limits)
            try:
                return await _made(step, new_call(limits), prices, meters, on_text)
            except errors.BudgetExceeded as exc:  # refused before asking again: park
                meter = usage.run_meter()
                budget.count_refused(exc, (*meters, meter))
                await budget.park(limits, str(exc), meter.charged if meter else usage.Tokens())

    return budgeted()


def _made(
    step: steps.StepFunction[[Call], JSON],
    call: Call,
    prices: Mapping[str, usage.Price],
    meters: Iterable[usage.Meter],
    on_text: Callable[[str, bool], None] | None = None,
) -> Coroutine[Any, Any, JSON]:
    pending = step(call)
    run_meter = usage.run_meter()

    async def finish() -> JSON:
        response = await pending
        earlier = earlier_requests(response)
        tokens = usage.tokens_of(response, prices)
        for meter in (*meters, run_meter):
            if meter is not None:
                meter.add(tokens, live=call.live, interrupted=earlier)
        if on_text is not None and not (call.live and call.on_delta is not None):
            said = _text_of(response)
            if said:
                on_text(said, not call.live)
        return response

    return finish()


def _text_of(response: Mapping[str, Any]) -> str:
    choices = response.get("choices") or [{}]
    return str((choices[0].get("message") or {}).get("content") or "")


def first_message(response: Mapping[str, Any]) -> JSON:
    """The assistant message of the response's first choice; ModelResponseError if none."""
    choices = response.get("choices") or []
    message = choices[0].get("message") if choices else None
    if not isinstance(message, dict):
        raise exceptions.ModelResponseError(
            f"the model's response has no message: {str(dict(response))[:200]}"
        )
    return message
