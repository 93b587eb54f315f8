"""Workflows the server tests drive: a refund gated on approval, a transfer that parks for review.

Importable by a worker process (``durably worker tests.serverkit.flows``) as well
as by the tests themselves. ``transfer`` hangs while ``HANG`` holds an event, so
a test can stop an engine hard inside it and leave an intent without receipt.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durably
from durably import agents
from durably.agents import approvals

HANG: dict[str, asyncio.Event] = {}
RAN: list[str] = []


@agents.tool(requires_approval=True)
async def refund(order_id: str, cents: int) -> dict[str, Any]:
    """Refund an order; a person approves it first."""
    return {"refund_id": f"re_{order_id}", "cents": cents}


@durably.workflow(name="srv-refund")
async def refund_flow(order_id: str, cents: int) -> Any:
    try:
        return await refund(order_id, cents)
    except agents.ApprovalRejected as exc:
        return {"rejected": str(exc), "by": exc.by}


@durably.step(at_most_once=True)
async def transfer(order_id: str) -> dict[str, str]:
    RAN.append(order_id)
    if "hang" in HANG:
        await HANG["hang"].wait()
    return {"transfer_id": f"tr_{order_id}"}


@durably.workflow(name="srv-transfer")
async def transfer_flow(order_id: str) -> Any:
    try:
        return await transfer(order_id)
    except durably.ResolvedAsFailed as exc:
        return f"gave up: {exc}"


@durably.workflow(name="srv-wait")
async def wait_flow(timeout: float | None = None) -> Any:
    return await durably.wait_for_signal("go", timeout=timeout)


@durably.workflow(name="srv-sleep")
async def sleep_flow(seconds: float) -> None:
    await durably.sleep(seconds)


@durably.step
async def declined(order_id: str) -> None:
    raise ValueError(f"card declined for {order_id}")


@durably.workflow(name="srv-fail")
async def fail_flow(order_id: str) -> Any:
    """Fails in its step: the step's entry and the workflow hold the ValueError."""
    return await declined(order_id)


@durably.step
async def fetch_order(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "total": 120}


@durably.step
async def slow_charge(order_id: str, flag: str) -> dict[str, str]:
    """Write ``flag + '.started'``, then wait while the file ``flag`` exists (a test kills us)."""
    Path(flag + ".started").write_text("started")
    while Path(flag).exists():
        await asyncio.sleep(0.05)
    return {"charge_id": f"ch_{order_id}"}


@durably.workflow(name="srv-crash")
async def crash_flow(order_id: str, flag: str) -> Any:
    order = await fetch_order(order_id)
    charge = await slow_charge(order_id, flag)
    return {**order, **charge}


@durably.workflow(name="srv-parent")
async def parent_flow(order_id: str) -> Any:
    """A parent with one child (``<order_id>-child``): the dashboard's parent filter finds it."""
    child = await durably.start_child(
        crash_flow, order_id, "/nonexistent-flag", workflow_id=f"{order_id}-child"
    )
    return await child.result()


def nested(depth: int) -> Any:
    """A list nested ``depth`` deep: ``[[[...]]]``."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@durably.step
async def nest(depth: int) -> Any:
    return nested(depth)


@durably.workflow(name="srv-deep")
async def deep_flow(depth: int) -> Any:
    """A step result and an output nested ``depth`` deep (as deep as the codec writes)."""
    return await nest(depth)


@durably.workflow(name="srv-deep-approval")
async def deep_approval_flow(depth: int) -> Any:
    """A tool call awaiting approval whose arguments nest ``depth`` lists deep, published
    as a gated call publishes one (a decorated tool's arguments, validated, nest less
    deep: another writer's, or a workflow's own, may nest as deep as the codec writes)."""
    request = approvals.Request("ship", {"items": nested(depth)}, "call-deep", None, "reject")
    (gate,) = approvals.open_gates([request])
    return await durably.wait_for_signal(gate.signal)
