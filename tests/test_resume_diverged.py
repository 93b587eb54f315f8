"""Resuming a diverged workflow after deploying compatible code (``durably resume``).

A diverged workflow is resumed from its whole journal: the new run replays every
recorded call, including a cancellation delivered before the divergence. The code
changes between engines as a deploy would (``CODE`` picks it, as tests/patchkit.py
does with its environment); the database is a real SQLite file.
"""

from __future__ import annotations

import asyncio
import json

import durably
from durably import Client

CODE = "v1"  # v1: the step is "fetch"; v2 renamed it "fetch_v2"; v3 is v1 again


@durably.step(name="fetch")
def fetch() -> str:
    return "fetched"


@durably.step(name="fetch_v2")
def fetch_v2() -> str:
    return "fetched"


@durably.workflow(name="resume-diverged-cancelled")
async def cancelled_then_cleanup() -> str:
    await (fetch_v2() if CODE == "v2" else fetch())
    try:
        await durably.wait_for_signal("go")
    except durably.Cancelled:
        ack = await durably.wait_for_signal("ack")  # the cleanup waits for a person
        return f"cleaned up after the cancel: {ack}"
    return "went on as if never cancelled"


async def _until(engine: durably.Engine, wid: str, status: str) -> None:
    for _ in range(400):
        if (await engine.get_workflow(wid)).status == status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{wid} never became {status}: {(await engine.get_workflow(wid)).status}")


def test_a_diverged_workflow_resumes_with_the_cancellation_it_had_received(
    sqlite_url: str,
) -> None:
    """The cancel was delivered at seq 2 and the cleanup parked at seq 3 when a deploy
    renamed the step at seq 1. Resumed on compatible code, it replays the cancel and
    finishes its cleanup; before, the resume dropped the journal from the cancel on
    (as for a cancelled workflow), and the workflow waited for "go" as if never cancelled."""
    global CODE

    async def scenario() -> None:
        global CODE
        CODE = "v1"
        async with durably.Engine(sqlite_url, poll_interval=0.02) as engine:
            await engine.start(cancelled_then_cleanup, workflow_id="w")
            await _until(engine, "w", "waiting")
            await engine.cancel("w")
            for _ in range(400):  # the cleanup parks at its own wait
                history = await engine.history("w")
                if any(e.kind == "signal" and e.name == "ack" for e in history):
                    break
                await asyncio.sleep(0.02)
            await _until(engine, "w", "waiting")
        CODE = "v2"
        async with durably.Engine(sqlite_url, poll_interval=0.02) as engine:
            await engine.send_signal("w", "ack", "ok")
            await _until(engine, "w", "diverged")
        CODE = "v3"
        async with durably.Engine(sqlite_url, poll_interval=0.02) as engine:
            await engine.resume("w")
            await _until(engine, "w", "completed")

    try:
        asyncio.run(scenario())
    finally:
        CODE = "v1"
    with Client(sqlite_url) as client:
        info = client.get_workflow("w")
    assert json.loads(info.output or "null") == "cleaned up after the cancel: ok"
