"""The workflows of tests/test_lifecycle.py, imported by its worker processes.

Every step appends one line to the effects file before and after it acts
(``multiworker_flows.record``), so a test counts how many times it started.
"""

from __future__ import annotations

import time

import durably
from tests.multiworker_flows import record


@durably.step
def slow_sync(seconds: float) -> str:
    """A plain step still running when its worker is asked to stop."""
    record("slow-start")
    time.sleep(seconds)
    record("slow-end")
    return "slow"


@durably.step
def after() -> str:
    record("after")
    return "after"


@durably.workflow(name="life.drain")
async def drain_flow(seconds: float) -> list[str]:
    return [await slow_sync(seconds), await after()]


@durably.step
async def blocking(seconds: float) -> str:
    """An async step that blocks its event loop, as a blocking SDK call would."""
    record("block-start")
    time.sleep(seconds)
    record("block-end")
    return "blocked"


@durably.workflow(name="life.blocked")
async def blocked_flow(seconds: float) -> list[str]:
    return [await blocking(seconds), await after()]
