"""FakeModelServer: the real openai client against scripted replies, failures and streams."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from durably.testing.models import (
    FakeModelServer,
    by_turn,
    call,
    failure,
    read_log,
    text,
    tool_calls,
)
from tests.agentkit import harness

USER = [{"role": "user", "content": "hi"}]


def test_a_list_is_answered_in_order_and_every_request_is_logged(tmp_path: Path) -> None:
    log = tmp_path / "model.jsonl"
    script = [tool_calls(call("f", {"x": 1}, id="t1")), text("bye", usage={"prompt_tokens": 7})]
    with (
        FakeModelServer(script, log_path=log) as server,
        openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        first = client.chat.completions.create(model="gpt-4.1-mini", messages=USER)
        second = client.chat.completions.create(
            model="m", messages=USER, extra_headers={"Idempotency-Key": "wf:3"}
        )
        with pytest.raises(openai.InternalServerError, match="no reply left"):
            client.chat.completions.create(model="m", messages=USER)
        assert [m.id for m in client.models.list()] == ["fake-model"]
    [tc] = first.choices[0].message.tool_calls or []
    assert (tc.id, tc.function.name, json.loads(tc.function.arguments)) == ("t1", "f", {"x": 1})
    assert first.choices[0].finish_reason == "tool_calls" and first.model == "gpt-4.1-mini"
    assert second.choices[0].message.content == "bye" and second.usage is not None
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (7, 0)
    logged = read_log(log)
    assert [r["status"] for r in logged] == [200, 200, 500]
    assert [r["idempotency_key"] for r in logged] == [None, "wf:3", None]
    assert logged[0]["body"]["messages"] == USER and logged == server.requests


def test_by_turn_answers_the_same_turn_the_same_way() -> None:
    script = by_turn([tool_calls(call("f")), text("done")])
    again = [*USER, {"role": "assistant", "content": None}, {"role": "tool", "content": "x"}]
    with (
        FakeModelServer(script) as server,
        openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        replies = [
            client.chat.completions.create(model="m", messages=messages)
            for messages in (USER, USER, again)
        ]
    assert [r.choices[0].finish_reason for r in replies] == ["tool_calls", "tool_calls", "stop"]
    assert replies[0].choices[0].message.tool_calls == replies[1].choices[0].message.tool_calls
    assert replies[0].usage == replies[1].usage
    assert [r["turn"] for r in server.requests] == [0, 0, 1]


def test_injected_failures_carry_retry_after() -> None:
    with FakeModelServer([text("ok")]) as server:
        server.fail_next(failure(429, retry_after=3), failure(500))
        with openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as client:
            with pytest.raises(openai.RateLimitError) as limited:
                client.chat.completions.create(model="m", messages=USER)
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model="m", messages=USER)
            ok = client.chat.completions.create(model="m", messages=USER)
    assert limited.value.response.headers["retry-after"] == "3"
    assert ok.choices[0].message.content == "ok"
    assert [r["status"] for r in server.requests] == [429, 500, 200]


async def test_a_streamed_reply_arrives_as_chunks_with_usage() -> None:
    reply = tool_calls(call("lookup", {"order_id": "A1"}, id="c9"), content="Let me look.")
    with FakeModelServer([reply, reply]) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="m", messages=USER, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
            whole = await client.chat.completions.create(model="m", messages=USER)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    args = "".join(
        tc.function.arguments or ""
        for c in chunks
        if c.choices
        for tc in c.choices[0].delta.tool_calls or []
        if tc.function
    )
    assert content == "Let me look." and json.loads(args) == {"order_id": "A1"}
    assert len(chunks) > 4 and chunks[-1].usage == whole.usage
    assert [r["stream"] for r in server.requests] == [True, False]


def test_it_runs_as_a_process(tmp_path: Path) -> None:
    script, port_file, log = tmp_path / "s.json", tmp_path / "port", tmp_path / "log.jsonl"
    script.write_text(json.dumps({"by_turn": [{"content": "from a file"}]}))
    argv = ["-m", "durably.testing.models", "--script", str(script)]
    argv += ["--port-file", str(port_file), "--log", str(log)]
    env = harness.child_env("", tmp_path / "unused")
    proc = subprocess.Popen([sys.executable, *argv], cwd=harness.REPO, env=env)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1/chat/completions"
        body = json.dumps({"model": "m", "messages": USER}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert answer["choices"][0]["message"]["content"] == "from a file"
    assert [r["status"] for r in read_log(log)] == [200]
