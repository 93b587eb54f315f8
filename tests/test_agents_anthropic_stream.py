"""Anthropic's Messages API streamed: ``llm(AsyncAnthropic()).messages.create(stream=True)``
and ``Agent(stream=True, client=AsyncAnthropic())`` with ``on_event``.

The real ``anthropic`` client against the fake model server's server-sent
events. Events reach the caller while the model step runs; the journal keeps
one entry per turn; a turn served from the journal yields its recorded text
once, marked replayed; a turn cut off by a SIGKILL is asked again and streamed
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

import anthropic

import durably
from durably import agents
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness

LONG = "Your order A1 has shipped and should arrive on Tuesday, before noon."
SEEN: list[tuple[str, bool]] = []
KINDS: list[str] = []
LLM: list[agents.DurableLLM] = []
AGENT: list[agents.Agent] = []
EVENTS: list[agents.AgentEvent] = []


@durably.workflow(name="anthropic-stream-replay")
async def stream_then_wait(question: str) -> dict[str, Any]:
    stream = await LLM[0].messages.create(
        model="claude-sonnet-4-6",
        max_tokens=200,
        messages=[{"role": "user", "content": question}],
        stream=True,
    )
    async for event in stream:
        KINDS.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            SEEN.append((event.delta.text, stream.replayed))
    await durably.wait_for_signal("go")
    assert stream.message is not None
    return {
        "type": type(stream.message).__name__,
        "text": stream.message.content[0].text,
        "stop_reason": stream.message.stop_reason,
        "output_tokens": stream.message.usage.output_tokens,
    }


async def _until_waiting(handle: durably.WorkflowHandle[Any]) -> None:
    deadline = asyncio.get_running_loop().time() + 15
    while (status := await handle.status()) != "waiting":
        assert status in ("pending", "running"), status
        assert asyncio.get_running_loop().time() < deadline, "never parked"
        await asyncio.sleep(0.02)


async def test_events_arrive_live_and_a_replay_yields_the_text_once(store_url: str) -> None:
    with FakeModelServer(
        by_turn([text(LONG, usage={"prompt_tokens": 50, "completion_tokens": 17})])
    ) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        LLM[:] = [agents.llm(client)]
        SEEN.clear()
        KINDS.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(stream_then_wait, "where?", workflow_id="wf")
            await _until_waiting(handle)
        live, live_kinds = list(SEEN), list(KINDS)
        SEEN.clear()
        KINDS.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            await engine.send_signal("wf", "go")
            result = await engine.handle("wf").result(timeout=10)
            history = await engine.history("wf")
        replayed, replayed_kinds = list(SEEN), list(KINDS)
        await client.close()
        assert len(server.requests) == 1  # the replay asked nothing
        assert server.requests[0]["stream"] is True

    assert len(live) > 3, live  # in pieces, not once at the end
    assert "".join(p for p, _ in live) == LONG
    assert not any(r for _, r in live)
    assert live_kinds[0] == "message_start" and live_kinds[-1] == "message_stop"
    assert replayed == [(LONG, True)]  # once, whole, marked
    assert replayed_kinds[0] == "message_start" and replayed_kinds[-1] == "message_stop"
    assert result == {
        "type": "Message",
        "text": LONG,
        "stop_reason": "end_turn",
        "output_tokens": 17,
    }
    [turn] = [e for e in history if e.name == "llm:chat.completions"]  # one entry per turn
    record = json.loads(turn.payload or "")
    assert record["provider"] == "anthropic"
    assert record["choices"][0]["message"]["content"] == LONG
    assert record["usage"]["prompt_tokens"] == 50 and record["usage"]["completion_tokens"] == 17


async def test_a_sync_anthropic_client_streams_too(sqlite_url: str) -> None:
    with FakeModelServer(by_turn([text(LONG)])) as server:
        with anthropic.Anthropic(
            base_url=server.anthropic_url, api_key="t", max_retries=0
        ) as client:
            LLM[:] = [agents.llm(client)]
            SEEN.clear()
            async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.1) as engine:
                handle = await engine.start(stream_then_wait, "where?", workflow_id="wf")
                await _until_waiting(handle)
                live = list(SEEN)
                await engine.send_signal("wf", "go")
                assert (await handle.result(timeout=10))["text"] == LONG
        assert len(server.requests) == 1
    assert len(live) > 3 and "".join(p for p, r in live if not r) == LONG


@agents.tool
async def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@durably.workflow(name="anthropic-stream-agent")
async def agent_flow(question: str) -> str:
    result = await AGENT[0].run(question, on_event=EVENTS.append)
    await durably.wait_for_signal("go")
    return str(result.output)


async def test_an_agent_streams_anthropic_turns_to_on_event(store_url: str) -> None:
    script = by_turn(
        [
            tool_calls(call("lookup", {"order_id": "A1"}, id="toolu_1"), content="Let me look."),
            text(LONG),
        ]
    )
    with FakeModelServer(script) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_url, api_key="t", max_retries=0)
        AGENT[:] = [
            agents.Agent(client=client, model="claude-sonnet-4-6", tools=[lookup], stream=True)
        ]
        EVENTS.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(agent_flow, "Where is A1?", workflow_id="wf")
            await _until_waiting(handle)
        live = list(EVENTS)
        EVENTS.clear()
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.1) as engine:
            await engine.send_signal("wf", "go")
            assert await engine.handle("wf").result(timeout=10) == LONG
            history = await engine.history("wf")
        replayed = list(EVENTS)
        await client.close()
        assert [r["stream"] for r in server.requests] == [True, True]  # the replay asked nothing
        second = server.requests[1]["body"]["messages"][1]["content"]
        assert second[1] == {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "lookup",
            "input": {"order_id": "A1"},
        }

    texts = [e for e in live if e.kind == "text"]
    assert "".join(e.text for e in texts if e.turn == 1) == "Let me look."
    assert len([e for e in texts if e.turn == 2]) > 3  # the answer in pieces, live
    assert "".join(e.text for e in texts if e.turn == 2) == LONG
    assert not any(e.replayed for e in live)
    assert [(e.kind, e.tool, e.call_id) for e in live if e.kind != "text"] == [
        ("tool_start", "lookup", "toolu_1"),
        ("tool_end", "lookup", "toolu_1"),
    ]
    assert [(e.kind, e.text, e.replayed) for e in replayed if e.kind == "text"] == [
        ("text", "Let me look.", True),
        ("text", LONG, True),
    ]
    assert all(e.replayed for e in replayed)
    assert len([e for e in history if e.name == "llm:chat.completions"]) == 2


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
        env = harness.child_env(server.anthropic_url, tmp_path / "effects.jsonl")
        argv = ["-m", "tests.agentkit.anthropic_stream_child", "--db", str(db)]
        argv += ["--url", server.anthropic_url]
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
    assert {r["path"] for r in requests} == {"/v1/messages"}
    again = _lines(tmp_path / "again.jsonl")
    assert len(again) > 3 and "".join(d["text"] for d in again) == LONG  # streamed once more
    assert not any(d["replayed"] for d in again)
    assert result["result"] == {"text": LONG, "replayed": False}

    async def history() -> list[str]:
        async with durably.Engine(f"sqlite:///{db}") as engine:
            return [e.name for e in await engine.history("s-1") if e.name.startswith("llm:")]

    assert asyncio.run(history()) == ["llm:chat.completions"]  # one entry for the turn
