"""Workflows for the operations tests (archives, retention, backups), importable by a worker
process: ``durably worker tests.ops_flows``. Each step appends a line to the file named by
OPS_EFFECTS (when set), so a test counts what ran, in any process."""

from __future__ import annotations

import os
import time
from typing import Any

import durably

EFFECTS = "OPS_EFFECTS"


def record(label: str) -> None:
    path = os.environ.get(EFFECTS)
    if path:
        with open(path, "a") as f:
            f.write(label + "\n")


@durably.step
def tick(wid: str, k: int) -> int:
    record(f"{wid}:{k}")
    time.sleep(float(os.environ.get("OPS_STEP_SECONDS", "0")))
    return k


@durably.workflow(name="ops.steps")
async def steps(wid: str, n: int) -> int:
    total = 0
    for k in range(1, n + 1):
        total += await tick(wid, k)
    return total


@durably.workflow(name="ops.waiter")
async def waiter(wid: str) -> list[Any]:
    first = await tick(wid, 1)
    durably.set_event("stage", "waiting")
    go = await durably.wait_for_signal("go")
    return [first, go, await tick(wid, 2)]


@durably.workflow(name="ops.child")
async def child(wid: str) -> str:
    await tick(wid, 1)
    return f"child of {wid}"


@durably.workflow(name="ops.parent")
async def parent(wid: str) -> list[Any]:
    handle = await durably.start_child(child, wid, workflow_id=f"{wid}-child")
    done = await handle.result()
    go = await durably.wait_for_signal("go")
    return [done, go]


@durably.workflow(name="ops.detached")
async def detached(wid: str) -> str:
    """Start a child that waits for its signal and finish without joining it."""
    handle = await durably.start_child(waiter, wid, workflow_id=f"{wid}-child")
    return handle.workflow_id


def effects(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except FileNotFoundError:
        return []
