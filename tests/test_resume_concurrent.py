"""``resume`` of a workflow whose tasks ran at once and which was cancelled.

Resume continues a cancelled workflow from where its cancellation stopped it, dropping
the journal from the cancel marker on. Entries after the marker in a workflow of one
task are its cleanup's; in one whose tasks ran at once they may be another task's
progress: a step it ran, a child it started or a signal it sent (dropped, it would do
them again, under another seq): such a resume is refused, naming the entry. A signal it
received goes back to the queue with the dropped entries, and is received again. A real
SQLite file.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import durably
from tests.agentkit.live import until


@durably.workflow(name="resume-concurrent")
async def two_branches() -> list[str]:
    async def sleeper() -> str:
        await durably.sleep(1000)  # seq 1: cancelled here
        return "slept"

    async def listener() -> str:
        await asyncio.sleep(0.1)  # not durable: its wait takes seq 2
        return str(await durably.wait_for_signal("go"))

    return list(await asyncio.gather(sleeper(), listener()))


async def test_a_signal_another_task_received_after_the_cancel_is_received_again(
    sqlite_url: str,
) -> None:
    """Another task received a signal after the cancel's marker: resume drops its entry,
    gives the signal back, and the task receives it again (before, resume was refused:
    dropped, the signal would have been gone)."""
    async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
        handle = await engine.start(two_branches, workflow_id="w")
        await until(handle, "waiting")
        history = await engine.history("w")
        assert [(e.seq, e.kind) for e in history] == [(1, "sleep"), (2, "signal")]
        await engine.send_signal("w", "go", "payload")
        for _ in range(200):  # the listener consumed it: its entry completed
            if any(
                e.kind == "signal" and e.status == "completed" for e in await engine.history("w")
            ):
                break
            await asyncio.sleep(0.05)
        await engine.cancel("w")
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=10)
        history = await engine.history("w")
        assert [(e.seq, e.kind) for e in history] == [(1, "cancel"), (2, "signal")]
        await engine.resume("w")
        await until(handle, "sleeping")
        history = await engine.history("w")
        received = [e for e in history if e.kind == "signal" and e.status == "completed"]
        assert [json.loads(e.payload or "null") for e in received] == ["payload"]


@durably.workflow(name="resume-cleanup-signal")
async def cleanup_takes_a_signal() -> str:
    try:
        await durably.wait_for_signal("go")  # seq 1: cancelled here
        return "went on"
    finally:
        ack = await durably.wait_for_signal("ack", timeout=1.0)  # seq 2: consumes "ack"
        RECEIVED.append(ack)


RECEIVED: list[object] = []


async def test_a_resume_gives_back_the_signals_its_dropped_entries_took(
    sqlite_url: str,
) -> None:
    """A workflow of one task: its cleanup took a signal after the cancel's marker. Resume
    drops the entries from the marker on, so the cleanup runs again; the signal it took
    is given back with them, and its wait receives it again (it was lost: the wait timed
    out, the signal marked taken by an entry no longer there)."""
    RECEIVED.clear()
    async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
        handle = await engine.start(cleanup_takes_a_signal, workflow_id="c")
        await until(handle, "waiting")
        await engine.send_signal("c", "ack", "first ack")
        await engine.cancel("c")
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=10)
        assert RECEIVED == ["first ack"]
        await engine.resume("c")
        await until(handle, "waiting")
        await engine.send_signal("c", "go", None)
        assert await handle.result(timeout=10) == "went on"
    assert RECEIVED == ["first ack", "first ack"]
