"""``durably replay`` of a workflow that received a cancellation and is in its cleanup.

A live replay raises the recorded cancellation at its seq and runs the cleanup
against the entries after it; the rehearsal must do the same, so a deploy that
changes the cleanup is reported before it strands the workflow. The code changes
between the recording and the rehearsal as a deploy would (``CODE`` picks it, as
tests/patchkit.py does with its environment); the database is a real SQLite file.
"""

from __future__ import annotations

import asyncio

import durably
import durably.testing

CODE = "v1"  # v1: the cleanup waits for "ack"; v2 waits for "confirm" there instead


@durably.step(name="replay-cancelled.fetch")
def fetch() -> str:
    return "fetched"


@durably.workflow(name="replay-cancelled")
async def cancelled_then_cleanup() -> str:
    await fetch()
    try:
        await durably.wait_for_signal("go")
    except durably.Cancelled:
        ack = await durably.wait_for_signal("ack" if CODE == "v1" else "confirm")
        return f"cleaned up: {ack}"
    return "went on"


async def _park_in_cleanup(url: str) -> None:
    """Start the workflow, cancel it at its wait, and return once its cleanup is parked."""
    async with durably.Engine(url, poll_interval=0.02) as engine:
        await engine.start(cancelled_then_cleanup, workflow_id="w")
        for _ in range(500):
            history = await engine.history("w")
            if any(e.kind == "signal" and e.name == "go" for e in history):
                break
            await asyncio.sleep(0.02)
        await engine.cancel("w")
        for _ in range(500):
            history = await engine.history("w")
            info = await engine.get_workflow("w")
            if info.status == "waiting" and any(e.name == "ack" for e in history):
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"the cleanup never parked: {history}")


def test_replay_runs_the_cleanup_after_a_recorded_cancellation(sqlite_url: str) -> None:
    """Today's cleanup waits for another signal than the journal recorded at seq 3: a
    live replay diverges there, so the rehearsal reports it. Before, the rehearsal
    stopped at the cancellation's marker (seq 2) and reported the workflow as fine."""
    global CODE
    CODE = "v1"
    asyncio.run(_park_in_cleanup(sqlite_url))
    same = durably.testing.replay(database=sqlite_url)
    assert same.ok, [p.line() for p in same.problems]
    CODE = "v2"
    try:
        report = durably.testing.replay(database=sqlite_url)
    finally:
        CODE = "v1"
    assert [(p.workflow_id, p.seq) for p in report.problems] == [("w", 3)], report
    assert "signal 'ack'" in report.problems[0].message, report.problems[0].message
