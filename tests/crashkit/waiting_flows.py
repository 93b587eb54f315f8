"""Workflows that wait (timers, signals, children, cancellation) for the crash tests.

Run in child processes by :mod:`tests.crashkit.waiting_runner` or by ``durably
worker tests.crashkit.waiting_flows``. Every step appends one line per
invocation to the effects file (``CRASHKIT_EFFECTS``) through
:func:`tests.crashkit.flows.record`, so tests count what really ran. Workflow
names start with ``wc_`` so they never collide with other test modules'.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import durably
from tests.crashkit.flows import record


def _touch(path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())


@durably.step
def wc_mark(label: str) -> str:
    """A step that only records its label (the label is the effect's ``args[0]``)."""
    record(label)
    return label


@durably.step
def wc_slow(marker: str, seconds: float) -> str:
    """A step that creates ``marker`` once it runs, then takes ``seconds``."""
    record(marker)
    _touch(marker)
    time.sleep(seconds)
    return "slow done"


@durably.step
def wc_gate(gate: str) -> str:
    """A step that waits (up to 30 s) until the test creates the file ``gate``."""
    record(gate)
    deadline = time.monotonic() + 30
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.01)
    return "open"


@durably.step
def wc_fragile(broken: str) -> str:
    """A step that fails while the file ``broken`` exists (no retry: the workflow fails)."""
    record(broken)
    if os.path.exists(broken):
        raise RuntimeError("fragile broke")
    return "fixed"


# --- a durable timer -----------------------------------------------------------------


@durably.workflow
async def wc_nap(seconds: float) -> str:
    await wc_mark("before")
    await durably.sleep(seconds)
    return await wc_mark("after")


# --- signals -------------------------------------------------------------------------


@durably.workflow
async def wc_approval() -> Any:
    await wc_mark("before")
    durably.set_event("stage", "waiting for approval")
    decision = await durably.wait_for_signal("approval")
    await wc_mark("after")
    return decision


@durably.workflow
async def wc_two_approvals(gate: str) -> list[Any]:
    """Two waits for the same signal name, after a step the test holds with a gate file."""
    await wc_gate(gate)
    first = await durably.wait_for_signal("approval")
    await wc_mark("between")
    second = await durably.wait_for_signal("approval")
    await wc_mark("end")
    return [first, second]


# --- fan-out of children -------------------------------------------------------------


class ChildFailed(Exception):
    """What the failing child of ``wc_fan_out`` raises."""


@durably.step
async def wc_work(n: int) -> int:
    record(n)
    await asyncio.sleep(0.1 + 0.04 * n)  # the children finish one after another over ~2 s
    return n * n


@durably.workflow
async def wc_child(n: int, failing: int) -> int:
    value = await wc_work(n)
    if n == failing:
        raise ChildFailed(f"child {n} failed")
    return value


@durably.workflow
async def wc_fan_out(count: int, failing: int) -> dict[str, Any]:
    handles = [await durably.start_child(wc_child, n, failing) for n in range(count)]
    results = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
    return {
        "ok": [[n, r] for n, r in enumerate(results) if not isinstance(r, BaseException)],
        "failed": [
            [n, f"{type(r).__name__}: {r}"]
            for n, r in enumerate(results)
            if isinstance(r, BaseException)
        ],
        "ids": [h.workflow_id for h in handles],
    }


# --- cancellation, resume, fork --------------------------------------------------------


@durably.workflow
async def wc_cancellable(kind: str, marker: str) -> str:
    try:
        if kind == "sleep":
            await durably.sleep(30)
        elif kind == "wait":
            await durably.wait_for_signal("never")
        else:
            # long enough for the test's `durably cancel` process to start on a loaded
            # machine (at 1 s the step ended first under the full suite on 2 CPUs)
            await wc_slow(marker, 4.0)
            await wc_mark("after the slow step")
        return "finished"
    finally:
        await wc_mark(f"cleanup {kind}")


@durably.workflow
async def wc_cancel_then_wait() -> str:
    """A workflow whose ``finally`` block waits for a person before it cleans up."""
    try:
        await durably.wait_for_signal("never")
        return "finished"
    finally:
        await durably.wait_for_signal("cleanup-ok")
        await wc_mark("cleanup")


@durably.workflow
async def wc_fragile_flow(broken: str) -> list[str]:
    a = await wc_mark("a")
    b = await wc_fragile(broken)
    c = await wc_mark("c")
    return [a, b, c]


@durably.workflow
async def wc_five() -> list[str]:
    return [await wc_mark(f"s{n}") for n in range(1, 6)]


# --- for the worker ------------------------------------------------------------------


@durably.workflow
async def wc_slow_then(marker: str) -> list[str]:
    slow = await wc_slow(marker, 1.5)
    after = await wc_mark("after slow")
    return [slow, after]
