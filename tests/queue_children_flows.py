"""A parent that puts its children on a queue of concurrency 1, run in a child process by
tests/test_queue_features.py, which SIGKILLs it while the children wait their turn.

``python -m tests.queue_children_flows URL EFFECTS``: starts (or finds) workflow
``parent`` and prints its result as JSON. Each child's step appends its label to
EFFECTS when it starts, so the test counts what really ran.
"""

from __future__ import annotations

import asyncio
import json
import sys

import durably

CHILDREN = durably.Queue("qcc-children", concurrency=1)
EFFECTS = {"path": ""}


@durably.step
async def work(label: str) -> str:
    with open(EFFECTS["path"], "a", encoding="utf-8") as f:
        f.write(label + "\n")
    await asyncio.sleep(0.5)
    return label


@durably.workflow(name="qcc.child")
async def child(label: str) -> str:
    return await work(label)


@durably.workflow(name="qcc.parent")
async def parent(n: int) -> list[str]:
    handles = [await durably.start_child(child, f"c{i}", queue=CHILDREN) for i in range(n)]
    return [await h.result() for h in handles]


async def main(url: str) -> None:
    engine = durably.Engine(url, queues=[CHILDREN], poll_interval=0.1, lease_seconds=1.0)
    async with engine:
        handle = await engine.start(parent, 3, workflow_id="parent")
        print(json.dumps(await handle.result(timeout=60)), flush=True)


if __name__ == "__main__":
    EFFECTS["path"] = sys.argv[2]
    asyncio.run(main(sys.argv[1]))
