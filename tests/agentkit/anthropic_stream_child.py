"""The child process of the Anthropic ``messages.create(stream=True)`` crash test.

    python -m tests.agentkit.anthropic_stream_child --db PATH --url MODEL_URL --deltas FILE

Runs (or recovers) the workflow ``anthropic-stream``, which streams one Messages
API turn and appends every text delta it receives to FILE as a JSON line (with
the stream's ``replayed`` flag), flushed at once so the parent can kill it
mid-stream. Prints one JSON line with the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import anthropic

import durably
from durably import agents

DELTAS: list[str] = []
LLM: list[agents.DurableLLM] = []


@durably.workflow(name="anthropic-stream")
async def stream_flow(question: str) -> dict[str, Any]:
    stream = await LLM[0].messages.create(
        model="claude-sonnet-4-6",
        max_tokens=200,
        messages=[{"role": "user", "content": question}],
        stream=True,
    )
    async with stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                with open(DELTAS[0], "a", encoding="utf-8") as f:
                    f.write(json.dumps({"text": event.delta.text, "replayed": stream.replayed}))
                    f.write("\n")
    assert stream.message is not None
    return {"text": stream.message.content[0].text, "replayed": stream.replayed}


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    DELTAS[:] = [ns.deltas]
    async with anthropic.AsyncAnthropic(base_url=ns.url, api_key="t", max_retries=0) as client:
        LLM[:] = [agents.llm(client)]
        engine = durably.Engine(f"sqlite:///{ns.db}", hold_seconds=0.05, poll_interval=0.1)
        async with engine:
            handle = await engine.start(stream_flow, "tell me", workflow_id="s-1")
            result = await handle.result(timeout=30)
            return {"status": "completed", "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.agentkit.anthropic_stream_child")
    parser.add_argument("--db", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--deltas", required=True)
    ns = parser.parse_args(argv)
    sys.stdout.write(json.dumps(asyncio.run(run(ns))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
