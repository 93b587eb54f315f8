"""``durably.llm(client).chat.completions.create(..., stream=True)`` inside a workflow.

Chunks reach the caller while the model step runs; the journal keeps one entry
per turn; a turn served from the journal yields its recorded text once, with
``stream.replayed``; a turn cut off by a SIGKILL is asked again and streamed
again (the fake server's log counts the requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, read_log, text
from tests.agentkit import harness

LONG = "Your order A1 has shipped and should arrive on Tuesday, before noon."
SEEN: list[tuple[str, bool]] = []
LLM: list[agents.DurableLLM] = []


@durably.workflow(name="llm-stream-replay")
async def stream_then_wait(question: str) -> str:
    stream = await LLM[0].chat.completions.create(
        model="gpt-4.1-mini", messages=[{"role": "user", "content": question}], stream=True
    )
    async for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            SEEN.append((piece, stream.replayed))
    await durably.wait_for_signal("go")
    assert stream.completion is not None
    return stream.completion.choices[0].message.content or ""


async def _until_waiting(handle: durably.WorkflowHandle[Any]) -> None:
    deadline = asyncio.get_running_loop().time() + 15
    while (status := await handle.status()) != "waiting":
        assert status in ("pending", "running"), status
        assert asyncio.get_running_loop().time() < deadline, "never parked"
        await asyncio.sleep(0.02)


async def test_chunks_arrive_live_and_a_replay_yields_the_text_once(store_url: str) -> None:
    with FakeModelServer(by_turn([text(LONG)])) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            LLM[:] = [agents.llm(client)]
            SEEN.clear()
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                handle = await engine.start(stream_then_wait, "where?", workflow_id="wf")
                await _until_waiting(handle)
            live = list(SEEN)
            SEEN.clear()
            async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                await engine.send_signal("wf", "go")
                assert await engine.handle("wf").result(timeout=10) == LONG
                history = await engine.history("wf")
            replayed = list(SEEN)
        assert len(server.requests) == 1  # the replay asked nothing
        assert server.requests[0]["stream"] is True

    assert len(live) > 3, live  # in pieces, not once at the end
    assert "".join(p for p, _ in live) == LONG
    assert not any(r for _, r in live)
    assert replayed == [(LONG, True)]  # once, whole, marked
    assert len([e for e in history if e.name == "llm:chat.completions"]) == 1


async def test_a_sync_client_streams_too(sqlite_url: str) -> None:
    with FakeModelServer(by_turn([text(LONG)])) as server:
        with openai.OpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            LLM[:] = [agents.llm(client)]
            SEEN.clear()
            async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                handle = await engine.start(stream_then_wait, "where?", workflow_id="wf")
                await _until_waiting(handle)
                live = list(SEEN)
                await engine.send_signal("wf", "go")
                assert await handle.result(timeout=10) == LONG
        assert len(server.requests) == 1
    assert len(live) > 3 and "".join(p for p, r in live if not r) == LONG


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):  # a line torn by the kill
            out.append(json.loads(line))
    return out


def test_a_turn_killed_mid_stream_is_asked_again_and_streamed_once_more(tmp_path: Path) -> None:
    db, deltas, log = tmp_path / "s.db", tmp_path / "deltas.jsonl", tmp_path / "model.jsonl"
    script = by_turn([text(LONG, chunk_delay=0.2)])
    with FakeModelServer(script, log_path=log) as server:
        env = harness.child_env(server.url, tmp_path / "effects.jsonl")
        argv = ["-m", "tests.agentkit.stream_child", "--db", str(db), "--url", server.url]
        child = subprocess.Popen(
            [sys.executable, *argv, "--deltas", str(deltas)],
            cwd=harness.REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while len(_lines(deltas)) < 2:
                assert child.poll() is None, "the child ended before it was killed"
                assert time.monotonic() < deadline, "no delta arrived"
                time.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.wait(timeout=30)
        cut = _lines(deltas)
        assert len(cut) >= 2 and "".join(d["text"] for d in cut) != LONG  # killed mid-stream
        assert len(read_log(log)) == 1

        done = harness.run([*argv, "--deltas", str(tmp_path / "again.jsonl")], env)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])

    requests = read_log(log)
    assert [(r["turn"], r["stream"]) for r in requests] == [(0, True), (0, True)]  # asked again
    again = _lines(tmp_path / "again.jsonl")
    assert len(again) > 3 and "".join(d["text"] for d in again) == LONG  # streamed once more
    assert not any(d["replayed"] for d in again)
    assert result["result"] == {"text": LONG, "replayed": False}

    async def history() -> list[str]:
        async with durably.Engine(f"sqlite:///{db}") as engine:
            return [e.name for e in await engine.history("s-1") if e.name.startswith("llm:")]

    assert asyncio.run(history()) == ["llm:chat.completions"]  # one entry for the turn
