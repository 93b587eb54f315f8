"""Workflows run by the worker processes of tests/test_cancel_final.py and tests/test_deadlines.py.

Each step appends one line, ``<workflow id>:<label>``, to the file named by
``$CANCEL_EFFECTS`` before it returns: the tests count what really ran. Plain
code waits for the file ``go-<workflow id>`` in ``$CANCEL_FLAGS`` (polled, no
durable call), so that a test holds a workflow between two durable calls.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import durably

EFFECTS = "CANCEL_EFFECTS"
FLAGS = "CANCEL_FLAGS"


@durably.step
async def effect(label: str) -> str:
    with open(os.environ[EFFECTS], "a") as out:
        out.write(label + "\n")
    return label


async def released(workflow_id: str) -> None:
    """Plain code: wait until the test creates the flag file of ``workflow_id``."""
    flag = Path(os.environ[FLAGS]) / f"go-{workflow_id}"
    while not flag.exists():
        await asyncio.sleep(0.05)


@durably.workflow(name="cancel_flows.late_return")
async def late_return(workflow_id: str) -> int:
    await effect(f"{workflow_id}:before")
    await released(workflow_id)
    return 5


@durably.workflow(name="cancel_flows.two_steps")
async def two_steps(workflow_id: str) -> int:
    await effect(f"{workflow_id}:before")
    await released(workflow_id)
    await effect(f"{workflow_id}:after")
    return 5


@durably.step
async def undo(label: str) -> str:
    """A compensation: waits for the flag ``go-undo-<label>`` if ``<label>`` ends in ``:a``
    (the test kills the worker there), then appends ``undo <label>``."""
    if label.endswith(":a"):
        await released(f"undo-{label}")
    with open(os.environ[EFFECTS], "a") as out:
        out.write(f"undo {label}\n")
    return label


@durably.workflow(name="cancel_flows.booked_late_return")
async def booked_late_return(workflow_id: str) -> int:
    """Books two things with compensations, then returns after the test's flag: a cancel
    committed while it waits ends it ``cancelled``, and its compensations run."""
    for part in ("a", "b"):
        await effect(f"{workflow_id}:{part}")
        durably.compensate(undo, f"{workflow_id}:{part}")
    await released(workflow_id)
    return 5


@durably.step
async def model_call(label: str) -> str:
    """A long call (a model's answer): appends ``<label>:called``, then takes a minute."""
    with open(os.environ[EFFECTS], "a") as out:
        out.write(f"{label}:called\n")
    await asyncio.sleep(60)
    return label


@durably.workflow(name="cancel_flows.stoppable")
async def stoppable(workflow_id: str) -> str:
    """A long step raced against a ``stop`` signal (``wait_first``): a cancel delivered to
    the wait ends the race, the step is cut short, and the ``finally`` step runs."""
    try:
        _, result = await durably.wait_first(
            model_call(workflow_id), durably.wait_for_signal("stop")
        )
        return str(result)
    finally:
        await effect(f"{workflow_id}:cleanup")
