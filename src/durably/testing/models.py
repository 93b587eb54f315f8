"""A fake OpenAI-compatible model server: real HTTP on 127.0.0.1, scripted replies.

For tests of agents with the real ``openai`` client (``base_url=server.url``).
It serves ``POST /v1/chat/completions``, ``POST /v1/responses`` (the OpenAI
Responses API, :mod:`durably.testing.models_responses`), ``POST /v1/messages``
(Anthropic's Messages API, :mod:`durably.testing.models_anthropic`; point the
client at :attr:`FakeModelServer.anthropic_url`) and ``GET /v1/models`` from a
*script*: a list of replies consumed in order, or a function of the request
body, so replies can depend on the conversation. :func:`by_turn` picks the
reply by the number of model turns the request carries (assistant messages;
for the Responses API, runs of model output items in ``input``), which makes
the server answer the same turn the same way however often it is asked: what
replay and crash tests need. A request with ``stream: true`` is answered as
server-sent events of the same reply, in its API's format (a chat completion
with a usage chunk when ``stream_options.include_usage`` asks for one).
Failures (a 429 with ``Retry-After``, a 500) are replies too, scripted or
injected with :meth:`FakeModelServer.fail_next`.

Every request is recorded, in memory and, with ``log_path``, as one JSON line
appended and fsync'd before the answer is sent, so a test in another process
can count them: the body, the ``Idempotency-Key`` header, the turn, the status
and the usage served. As a process::

    python -m durably.testing.models --script FILE.json [--log PATH]
        [--port N] [--port-file PATH]

where FILE.json is a list of replies, or ``{"by_turn": [replies...]}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, cast

from durably.testing import loopback, models_anthropic, models_chat, models_responses

__all__ = [
    "FakeModelServer",
    "Reply",
    "ToolCall",
    "by_turn",
    "call",
    "failure",
    "read_log",
    "text",
    "tool_calls",
]

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One scripted tool call; ``id`` defaults to ``call_<turn>_<index>``."""

    name: str
    arguments: Mapping[str, Any] | str = dataclasses.field(default_factory=dict)
    id: str | None = None

    def arguments_text(self) -> str:
        """The arguments as the JSON text the API sends."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer: an assistant message (text and/or tool calls), or a failure.

    ``usage`` is ``{"prompt_tokens", "completion_tokens", "cached_tokens"}`` (and
    ``cache_write_tokens`` for the Messages API's cache writes); left
    out, it is computed from the request and reply sizes (the same request gets
    the same usage). A ``status`` other than 200 answers an OpenAI-style error
    with ``error`` as its message and ``headers`` (e.g. ``Retry-After``).
    ``delay`` is slept before answering; ``chunk_delay`` between the chunks of a
    streamed answer (so a test can kill its client mid-stream).
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    usage: Mapping[str, int] | None = None
    finish_reason: str | None = None
    status: int = 200
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    error: str | None = None
    delay: float = 0.0
    model: str | None = None
    chunk_delay: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reply:
        """A reply from its JSON form (the script file's format)."""
        calls = [
            ToolCall(str(c["name"]), c.get("arguments") or {}, c.get("id"))
            for c in data.get("tool_calls") or ()
        ]
        return cls(
            content=data.get("content"),
            tool_calls=calls,
            usage=data.get("usage"),
            finish_reason=data.get("finish_reason"),
            status=int(data.get("status", 200)),
            headers=dict(data.get("headers") or {}),
            error=data.get("error"),
            delay=float(data.get("delay", 0.0)),
            model=data.get("model"),
            chunk_delay=float(data.get("chunk_delay", 0.0)),
        )


def text(content: str, **options: Any) -> Reply:
    """A final answer."""
    return Reply(content=content, **options)


def call(
    name: str, arguments: Mapping[str, Any] | str | None = None, id: str | None = None
) -> ToolCall:
    """One tool call for :func:`tool_calls`."""
    return ToolCall(name, {} if arguments is None else arguments, id)


def tool_calls(*calls: ToolCall, content: str | None = None, **options: Any) -> Reply:
    """An assistant message calling tools (several calls are parallel tool calls)."""
    return Reply(content=content, tool_calls=calls, **options)


def failure(
    status: int,
    *,
    retry_after: float | str | None = None,
    message: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """An error answer, e.g. ``failure(429, retry_after=0.2)`` or ``failure(500)``."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = str(retry_after)
    return Reply(status=status, headers=all_headers, error=message or f"fake error {status}")


Script = Sequence[Reply | Mapping[str, Any]] | Callable[[JSON], Reply | Mapping[str, Any]]


def turn_of(body: Mapping[str, Any]) -> int:
    """How many model turns the request carries: 0 for the first turn.

    For chat completions, the assistant messages. For the Responses API, the
    runs of model output items (assistant messages, function calls, reasoning)
    in ``input``: one turn's parallel function calls are one run.
    """
    if "messages" not in body and "input" in body:
        return _responses_turns(body.get("input"))
    messages = body.get("messages") or []
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


_MODEL_ITEMS = frozenset({"function_call", "reasoning", "custom_tool_call"})


def _responses_turns(items: Any) -> int:
    if not isinstance(items, list):
        return 0
    turns, in_run = 0, False
    for item in items:
        if not isinstance(item, dict):
            in_run = False
            continue
        kind = item.get("type")
        produced = kind in _MODEL_ITEMS or (
            kind in (None, "message") and item.get("role") == "assistant"
        )
        if produced and not in_run:
            turns += 1
        in_run = produced
    return turns


def by_turn(replies: Sequence[Reply | Mapping[str, Any]]) -> Callable[[JSON], Reply]:
    """A script answering turn N (N assistant messages so far) with ``replies[N]``."""
    chosen = [r if isinstance(r, Reply) else Reply.from_dict(r) for r in replies]

    def script(body: JSON) -> Reply:
        turn = turn_of(body)
        if turn >= len(chosen):
            return failure(500, message=f"no reply scripted for turn {turn}")
        return chosen[turn]

    return script


def read_log(path: str | os.PathLike[str]) -> list[JSON]:
    """Every request a server logged to ``path``, in order (torn lines skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeModels/1.0"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stall

    def setup(self) -> None:
        super().setup()
        quickack = getattr(socket, "TCP_QUICKACK", None)
        if quickack is not None:  # ack the request's header segment at once (Linux)
            self.connection.setsockopt(socket.IPPROTO_TCP, quickack, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the request log is the record."""

    def do_GET(self) -> None:
        app: FakeModelServer = cast(loopback.LoopbackHTTPServer, self.server).app
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            models = [{"id": app.model or "fake-model", "object": "model"}]
            self._json(200, {"object": "list", "data": models})
        else:
            self._json(404, models_chat.error_body("no such endpoint", 404))

    def do_POST(self) -> None:
        app: FakeModelServer = cast(loopback.LoopbackHTTPServer, self.server).app
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        endpoint = self.path.split("?")[0].rstrip("/")
        if endpoint not in ("/v1/chat/completions", "/chat/completions", *_RESPONSES, *_MESSAGES):
            self._json(404, models_chat.error_body("no such endpoint", 404))
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._json(400, models_chat.error_body("the body is not a JSON object", 400))
            return
        reply, answer = app._answer(body, self.headers.get("Idempotency-Key"), self.path)
        if reply.delay > 0:
            time.sleep(reply.delay)
        if reply.status != 200:
            self._json(reply.status, answer, reply.headers)
        elif body.get("stream") and endpoint in _MESSAGES:
            self._stream_events(models_anthropic.stream_events(answer), reply.chunk_delay)
        elif body.get("stream") and endpoint in _RESPONSES:
            self._stream_events(models_responses.stream_events(answer), reply.chunk_delay)
        elif body.get("stream"):
            self._stream(answer, body, reply.chunk_delay)
        else:
            self._json(200, answer)

    def _json(self, status: int, payload: object, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, completion: JSON, body: JSON, pause: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for i, chunk in enumerate(models_chat.stream_chunks(completion, include_usage)):
            if i and pause > 0:
                time.sleep(pause)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _stream_events(self, events: Iterator[tuple[str, JSON]], pause: float = 0.0) -> None:
        """Named server-sent events (Anthropic's, the Responses API's), no ``[DONE]``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for i, (event, data) in enumerate(events):
            if i and pause > 0:
                time.sleep(pause)
            self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()


_RESPONSES = ("/v1/responses", "/responses")
_MESSAGES = ("/v1/messages", "/messages")  # Anthropic's Messages API


class FakeModelServer(loopback.LoopbackService):
    """A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script.

    Use as a context manager or call :meth:`start` / :meth:`stop`; point a client
    at :attr:`url`. ``port=0`` picks a free port. ``model`` is the model name
    the answers report (what usage is priced by); by default the one asked for.
    """

    handler = _Handler
    thread_name = "fake-models"

    def __init__(
        self,
        script: Script,
        *,
        log_path: str | os.PathLike[str] | None = None,
        port: int = 0,
        model: str | None = None,
    ) -> None:
        self.script = script
        self.log_path = Path(log_path) if log_path is not None else None
        super().__init__(port)
        self.model = model
        self._lock = threading.Lock()
        self._requests: list[JSON] = []
        self._next = 0
        self._failures: list[Reply] = []

    # --- lifecycle ---------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ``base_url`` for an OpenAI client, e.g. ``http://127.0.0.1:54321/v1``."""
        return f"http://127.0.0.1:{self.bound_port}/v1"

    @property
    def anthropic_url(self) -> str:
        """The ``base_url`` for an Anthropic client (it adds ``/v1/messages`` itself)."""
        return f"http://127.0.0.1:{self.bound_port}"

    # --- scripting and inspection ------------------------------------------------------

    def fail_next(self, *failures: Reply) -> None:
        """Answer the next requests with these replies (e.g. ``failure(429)``) before the script."""
        with self._lock:
            self._failures.extend(failures)

    @property
    def requests(self) -> list[JSON]:
        """Every model request so far (either API), as logged (oldest first)."""
        with self._lock:
            return list(self._requests)

    def served(self) -> list[JSON]:
        """The requests answered 200, i.e. the completions a client received."""
        return [r for r in self.requests if r["status"] == 200]

    # --- answering (handler threads) -----------------------------------------------------

    def _answer(self, body: JSON, key: str | None, path: str) -> tuple[Reply, JSON]:
        """Pick the reply, build the answer, log the request; atomically."""
        with self._lock:
            n = len(self._requests) + 1
            reply = self._pick(body)
            ok = reply.status == 200
            endpoint = path.split("?")[0].rstrip("/")
            responses, messages = endpoint in _RESPONSES, endpoint in _MESSAGES
            if ok and messages:
                answer = self._build_message(reply, body, n)
            elif ok:
                answer = (self._build_response if responses else self._build)(reply, body, n)
            elif messages:
                answer = models_anthropic.error_body(
                    reply.error or f"fake error {reply.status}", reply.status
                )
            else:
                answer = models_chat.error_body(
                    reply.error or f"fake error {reply.status}", reply.status
                )
            line: JSON = {
                "n": n,
                "ts": time.time(),
                "path": path,
                "turn": turn_of(body),
                "idempotency_key": key,
                "stream": bool(body.get("stream")),
                "status": reply.status,
                "body": body,
                "reply": _logged_reply(answer, responses, messages) if ok else answer,
                "usage": answer.get("usage"),
            }
            self._requests.append(line)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        return reply, answer

    def _pick(self, body: JSON) -> Reply:
        if self._failures:
            return self._failures.pop(0)
        if callable(self.script):
            chosen = self.script(body)
        elif self._next < len(self.script):
            chosen = self.script[self._next]
            self._next += 1
        else:
            return failure(500, message=f"the script has no reply left ({len(self.script)} used)")
        return chosen if isinstance(chosen, Reply) else Reply.from_dict(chosen)

    def _build(self, reply: Reply, body: JSON, n: int) -> JSON:
        turn = turn_of(body)
        calls = [
            {
                "id": tc.id or f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments_text()},
            }
            for i, tc in enumerate(reply.tool_calls)
        ]
        message: JSON = {"role": "assistant", "content": reply.content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        return {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or self.model or str(body.get("model") or "fake-model"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": _usage(reply, body, calls),
        }

    def _build_response(self, reply: Reply, body: JSON, n: int) -> JSON:
        """A Responses API answer (see :mod:`durably.testing.models_responses`)."""
        turn = turn_of(body)
        calls = [
            (tc.id or f"call_{turn}_{i}", tc.name, tc.arguments_text())
            for i, tc in enumerate(reply.tool_calls)
        ]
        sized = [{"function": {"arguments": arguments}} for _, _, arguments in calls]
        return models_responses.build_response(
            content_text=reply.content,
            calls=calls,
            counted=_usage(reply, {"messages": body.get("input") or []}, sized),
            model=reply.model or self.model or str(body.get("model") or "fake-model"),
            instructions=body.get("instructions"),
            n=n,
            created=int(time.time()),
        )

    def _build_message(self, reply: Reply, body: JSON, n: int) -> JSON:
        """A Messages API answer (see :mod:`durably.testing.models_anthropic`)."""
        turn = turn_of(body)
        calls = [
            (tc.id or f"toolu_{turn}_{i}", tc.name, tc.arguments)
            for i, tc in enumerate(reply.tool_calls)
        ]
        sized = [
            {"function": {"arguments": json.dumps(_parsed(tc.arguments))}}
            for tc in reply.tool_calls
        ]
        return models_anthropic.build_message(
            content_text=reply.content,
            calls=calls,
            counted=_usage(reply, body, sized),
            cache_write=int((reply.usage or {}).get("cache_write_tokens", 0)),
            stop=reply.finish_reason,
            model=reply.model or self.model or str(body.get("model") or "fake-model"),
            n=n,
        )


def _parsed(arguments: Mapping[str, Any] | str) -> Any:
    return json.loads(arguments or "{}") if isinstance(arguments, str) else dict(arguments)


def _logged_reply(answer: JSON, responses: bool, messages: bool) -> Any:
    if messages:
        return answer["content"]
    return answer["output"] if responses else answer["choices"][0]["message"]


def _usage(reply: Reply, body: JSON, calls: list[JSON]) -> JSON:
    if reply.usage is not None:
        prompt = int(reply.usage.get("prompt_tokens", 0))
        completion = int(reply.usage.get("completion_tokens", 0))
        cached = int(reply.usage.get("cached_tokens", 0))
    else:
        prompt = max(1, len(json.dumps(body.get("messages") or [])) // 4)
        produced = len(reply.content or "") + sum(len(c["function"]["arguments"]) for c in calls)
        completion, cached = max(1, produced // 4), 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# --- command line ---------------------------------------------------------------------------


def load_script(path: str | os.PathLike[str]) -> Script:
    """A script from a JSON file: a list of replies, or ``{"by_turn": [...]}``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and "by_turn" in data:
        return by_turn(data["by_turn"])
    if isinstance(data, list):
        return [Reply.from_dict(r) for r in data]
    raise ValueError(f"{path}: expected a list of replies or {{'by_turn': [...]}}")


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; optionally write the chosen port to a file."""
    parser = argparse.ArgumentParser(prog="python -m durably.testing.models")
    parser.add_argument("--script", required=True, help="JSON file of replies")
    parser.add_argument("--log", default=None, help="JSONL request log (appended to)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here (atomically)")
    parser.add_argument("--model", default=None, help="model name to report (default: asked)")
    args = parser.parse_args(argv)
    server = FakeModelServer(
        load_script(args.script), log_path=args.log, port=args.port, model=args.model
    ).start()
    return loopback.serve_until_signal(server, args.port_file)


if __name__ == "__main__":
    raise SystemExit(main())
