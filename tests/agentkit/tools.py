"""Tools shared by the agent tests: each appends its effect to a file, so tests count runs.

``AGENTKIT_EFFECTS`` names the file (nothing is recorded without it);
``AGENTKIT_DELAYS`` (JSON ``{name: seconds}``) overrides how long ``work``
takes, so a restarted process can finish parallel calls in another order.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import durably
from durably import agents
from tests.agentkit.harness import DELAYS_ENV, EFFECTS_ENV


def effect(kind: str, **data: Any) -> None:
    """Record that a tool's side effect happened."""
    path = os.environ.get(EFFECTS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), **data}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The effects recorded in ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@agents.tool
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order's status.

    Args:
        order_id: The order's id, e.g. "A1".
    """
    effect("lookup", order_id=order_id)
    return {"order_id": order_id, "status": "shipped"}


@agents.tool(requires_approval=lambda args: args["cents"] > 10_000)
async def refund(order_id: str, cents: int) -> dict[str, Any]:
    """Refund part of an order.

    Args:
        order_id: The order to refund.
        cents: How much, in cents.
    """
    effect("refund", order_id=order_id, cents=cents, key=durably.idempotency_key())
    return {"refund_id": f"re_{order_id}", "cents": cents}


@agents.tool
async def work(name: str, delay: float) -> str:
    """Do some work that takes a while."""
    delays = json.loads(os.environ.get(DELAYS_ENV) or "{}")
    await asyncio.sleep(float(delays.get(name, delay)))
    effect("work", name=name)
    return f"done {name}"
