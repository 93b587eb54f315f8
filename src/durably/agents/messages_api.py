"""Anthropic's Messages API, natively, beside the OpenAI-compatible path.

``Agent(client=AsyncAnthropic(max_retries=0), model="claude-...")`` and
``durably.llm(AsyncAnthropic(max_retries=0)).messages.create(...)`` make each
``messages.create`` a model step, like a chat completion.

The journal format of a turn is provider neutral: whatever the provider, a
model step journals one record shaped like a chat completion (see
docs/agents.md, "What a turn journals")::

    {"id", "model", "provider": "anthropic",
     "choices": [{"index": 0, "finish_reason": "stop" | "tool_calls" | "length" | ...,
                  "message": {"role": "assistant", "content": text or None,
                              "tool_calls": [{"id", "type": "function",
                                              "function": {"name", "arguments": JSON text}}]}}],
     "stop_reason": the provider's own stop reason,
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens",
               "prompt_tokens_details": {"cached_tokens", "cache_write_tokens"}}}

So the agent loop, usage, budgets and ``durably show`` read every provider's
turns the same way. Anthropic's ``input_tokens`` leave out cache reads and
writes; here ``prompt_tokens`` counts all three and the details say how many
were read from and written to the cache, each priced at its own rate
(:class:`~durably.agents.Price` ``cached_input`` and ``cache_write``).

Kept: text and ``tool_use`` blocks, the stop reason and sequence, usage. Not
kept: other content blocks (thinking, server tool results, citations); an
agent that needs them sent back is not supported yet.

Streamed (``"stream": true``), the model step consumes the server-sent events
and journals the same one record, from the message :func:`assemble` builds;
a turn served from the journal is given to a streaming caller as the events
:func:`replay_events` makes of it, its text in one delta.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

JSON = dict[str, Any]

#: Anthropic's stop reasons as chat completions finish reasons.
FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
DEFAULT_MAX_TOKENS = 4096
_SYSTEM = ("system", "developer")
_TOOL_CHOICE = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}


def is_anthropic(client: Any) -> bool:
    """True for an ``Anthropic`` / ``AsyncAnthropic``-style client (``messages.create``)."""
    return hasattr(client, "messages") and not hasattr(client, "chat")


def request(params: Mapping[str, Any]) -> JSON:
    """A Messages API request from the chat-completions-shaped params the agent builds.

    System messages become ``system``; an assistant message's tool calls become
    ``tool_use`` blocks; consecutive tool messages become one user message of
    ``tool_result`` blocks; tools get an ``input_schema``. ``max_tokens``
    (required by the API) defaults to 4096. ``response_format`` is not sent
    (structured output is validated by the agent).
    """
    out: JSON = {
        k: v
        for k, v in params.items()
        if k not in ("messages", "tools", "response_format", "stream_options", "tool_choice")
    }
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    messages: list[JSON] = []
    system: list[str] = []
    for m in params.get("messages") or ():
        role = m.get("role")
        if role in _SYSTEM:
            system.append(str(m.get("content") or ""))
        elif role == "assistant":
            messages.append({"role": "assistant", "content": _assistant_blocks(m)})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": str(m.get("content") or ""),
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "user" and _all_results(last["content"]):
                last["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
        else:
            messages.append({"role": "user", "content": m.get("content")})
    if system and "system" not in out:
        out["system"] = "\n\n".join(system)
    out["messages"] = messages
    tools = [_tool(t) for t in params.get("tools") or ()]
    if tools:
        out["tools"] = tools
    choice = params.get("tool_choice")
    if isinstance(choice, str) and choice in _TOOL_CHOICE:
        out["tool_choice"] = _TOOL_CHOICE[choice]
    elif isinstance(choice, Mapping) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    return out


def _assistant_blocks(message: Mapping[str, Any]) -> list[JSON]:
    blocks: list[JSON] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": str(message["content"])})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks


def _all_results(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _tool(definition: Mapping[str, Any]) -> JSON:
    function = definition.get("function") or definition
    tool: JSON = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        tool["description"] = function["description"]
    return tool


def turn(message: Mapping[str, Any]) -> JSON:
    """The provider-neutral record of one Messages API response (see the module's docstring)."""
    content: Sequence[Any] = message.get("content") or ()
    texts = [str(b.get("text") or "") for b in content if b.get("type") == "text"]
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})},
        }
        for b in content
        if b.get("type") == "tool_use"
    ]
    said: JSON = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        said["tool_calls"] = calls
    usage = message.get("usage") or {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + written
    completion = int(usage.get("output_tokens") or 0)
    stop = message.get("stop_reason")
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "provider": "anthropic",
        "model": message.get("model"),
        "choices": [{"index": 0, "message": said, "finish_reason": FINISH.get(str(stop), "stop")}],
        "stop_reason": stop,
        "stop_sequence": message.get("stop_sequence"),
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
        },
    }


def message(record: Mapping[str, Any]) -> JSON:
    """The Messages API response (as JSON) a journaled turn stands for, for ``llm()``."""
    choice = (record.get("choices") or [{}])[0]
    said = choice.get("message") or {}
    blocks = _assistant_blocks(said)
    usage = record.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    read = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)
    return {
        "id": record.get("id"),
        "type": "message",
        "role": "assistant",
        "model": record.get("model"),
        "content": blocks,
        "stop_reason": record.get("stop_reason"),
        "stop_sequence": record.get("stop_sequence"),
        "usage": {
            "input_tokens": max(0, int(usage.get("prompt_tokens") or 0) - read - written),
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        },
    }


def assemble(events: Iterable[Mapping[str, Any]]) -> JSON:
    """The Messages API response (as JSON) the server-sent events of a streamed one make.

    ``message_start`` gives the message; each block starts with
    ``content_block_start`` and grows by ``text_delta`` pieces or, for a
    ``tool_use``, ``input_json_delta`` pieces of its input's JSON text;
    ``message_delta`` gives the stop reason and the final usage.
    """
    out: JSON = {"content": []}
    blocks: dict[int, JSON] = {}
    partial: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            out = {**(event.get("message") or {}), "content": []}
            out["usage"] = dict(out.get("usage") or {})
        elif kind == "content_block_start":
            index = int(event.get("index") or 0)
            blocks[index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index = int(event.get("index") or 0)
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                partial[index] = partial.get(index, "") + str(delta.get("partial_json") or "")
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    out[key] = delta[key]
            final = {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            out["usage"] = {**(out.get("usage") or {}), **final}
    for index, text in partial.items():
        try:
            blocks[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            blocks[index]["input"] = {}
    out["content"] = [blocks[i] for i in sorted(blocks)]
    return out


def replay_events(record: Mapping[str, Any]) -> list[JSON]:
    """The server-sent events standing for a journaled turn: each block whole, in one delta."""
    whole = message(record)
    head = {**whole, "content": [], "stop_reason": None, "stop_sequence": None}
    out: list[JSON] = [{"type": "message_start", "message": head}]
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            start: JSON = {"type": "text", "text": ""}
            delta: JSON = {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        out.append({"type": "content_block_delta", "index": index, "delta": delta})
        out.append({"type": "content_block_stop", "index": index})
    stop = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
    usage = {"output_tokens": whole["usage"]["output_tokens"]}
    out.append({"type": "message_delta", "delta": stop, "usage": usage})
    out.append({"type": "message_stop"})
    return out
