"""Parks that meet a wake-up on their way: the workflow still parks once all is blocked.

The interleavings are ordered by hand on the live run (its waits, its park), as in
test_promise_guards; what is asserted is what the store shows.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import durably
from durably import journal


async def _blocked(e: durably.Engine, workflow_id: str, count: int) -> Any:
    """The live run of ``workflow_id`` once ``count`` of its branches wait."""
    deadline = time.monotonic() + 30
    while True:
        run = e._runs.get(workflow_id)
        if run is not None and len(run._blocks) == count:
            return run
        assert time.monotonic() < deadline, "the workflow never blocked on its waits"
        await asyncio.sleep(0.005)


async def _status_becomes(handle: Any, status: str, within: float) -> str:
    """The workflow's status once it is ``status``, or the last seen after ``within`` s."""
    deadline = time.monotonic() + within
    seen = (await handle.info()).status
    while seen != status and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        seen = (await handle.info()).status
    return str(seen)


@durably.workflow
async def nap_and_listen() -> list[Any]:
    return list(await asyncio.gather(durably.sleep(30), durably.wait_for_signal("go")))


async def test_a_wait_woken_as_the_park_begins_does_not_keep_the_run_in_memory(
    sqlite_url: str,
) -> None:
    """A wake-up of a sleep (not due yet) in the same loop iteration as the hold running
    out: the park gives up (the woken wait may have left), and the branch blocks again
    while the park is on its way, which schedules nothing. The run must still park once
    it settles; it stayed in memory, holding its lease (and its queue's place), until
    its sleep ended."""
    async with durably.Engine(sqlite_url, hold_seconds=2.0, poll_interval=0.2) as e:
        handle = await e.start(nap_and_listen, workflow_id="raced")
        run = await _blocked(e, "raced", 2)
        assert run._park_timer is not None  # the hold is running
        run._park_timer.cancel()  # it runs out now, by hand:
        run._park_timer = None
        run.poke(journal.Kind.SLEEP, "")  # a wake-up of the sleep ...
        run._start_park()  # ... and the hold running out, in the same iteration
        await asyncio.wait_for(run.settle(), timeout=10)
        assert await _status_becomes(handle, "waiting", within=8.0) == "waiting"
        deadline = time.monotonic() + 5  # the park committed; its waits unwind next
        while "raced" in e._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert "raced" not in e._tasks  # parked: no task is held for it


# --- a child id another workflow holds ------------------------------------------------


@durably.workflow
async def squatter() -> str:
    return "squatter"


@durably.workflow
async def kid() -> str:
    return "kid"


@durably.workflow
async def adopt() -> str:
    try:
        await durably.start_child(kid, workflow_id="taken")
    except durably.WorkflowIdConflict:
        await durably.wait_for_signal("go")  # parks: what follows runs in a replay
        return "conflict"
    return "started"


async def test_a_child_id_taken_by_another_workflow_conflicts_again_on_replay(
    store_url: str,
) -> None:
    """start_child with an id that names a workflow of another name raises
    WorkflowIdConflict; it journaled the child's start all the same, so the replay after
    the park found it, returned a handle instead of raising, and took the other path:
    the workflow diverged (or joined a stranger's workflow)."""
    async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.2) as e:
        assert await (await e.start(squatter, workflow_id="taken")).result(timeout=10) == (
            "squatter"
        )
        handle = await e.start(adopt, workflow_id="adopter")
        assert await _status_becomes(handle, "waiting", within=8.0) == "waiting"
        await e.send_signal("adopter", "go")
        assert await handle.result(timeout=10) == "conflict"
        kinds = [x.kind for x in await e.history("adopter")]
    assert kinds == ["signal"]


# --- an engine stopping while a park is on its way -------------------------------------


@durably.workflow
async def long_nap() -> str:
    await durably.sleep(3600)
    return "rested"


async def test_a_wait_blocked_again_while_the_park_commits_is_unwound_by_it(
    tmp_path: Path,
) -> None:
    """The engine starts stopping while the park's commit waits for a lock held elsewhere:
    its poke wakes the sleep, which is not due and blocks again, as a new wait the park
    did not list. The park committed and unwound only the waits it listed: the new one
    held the workflow's task until close() gave up on it (its drain timeout)."""
    path = tmp_path / "durably.db"
    e = durably.Engine(f"sqlite:///{path}", hold_seconds=60.0, poll_interval=0.2)
    await e.open()
    handle = await e.start(long_nap, workflow_id="nap")
    run = await _blocked(e, "nap", 1)
    first = run._blocks[0]
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the park's commit waits for this
    try:
        assert run._park_timer is not None
        run._park_timer.cancel()
        run._park_timer = None
        run._start_park()
        deadline = time.monotonic() + 10
        while not run.inflight:  # the park's write is on its way
            assert time.monotonic() < deadline, "the park never began its write"
            await asyncio.sleep(0.005)
        closing = asyncio.create_task(e.close(drain_timeout=8.0))
        while not run._blocks or run._blocks[0] is first:  # poked: the sleep blocked anew
            assert time.monotonic() < deadline, "the stopping engine never poked the run"
            await asyncio.sleep(0.005)
    finally:
        lock.rollback()
        lock.close()
    began = time.monotonic()
    await asyncio.wait_for(closing, timeout=20)
    assert time.monotonic() - began < 4.0, "close() waited for a parked run's task"
    assert run.parked
    with durably.Client(f"sqlite:///{path}") as client:
        assert client.get_workflow(handle.workflow_id).status == "sleeping"
