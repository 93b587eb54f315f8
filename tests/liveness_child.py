"""A child process that holds one workflow in a running step until its stdin closes.

    python -m tests.liveness_child URL WORKFLOW_ID [EXECUTOR_ID]

Opens an engine (30 s lease) on URL, starts ``live.held`` under WORKFLOW_ID
(with EXECUTOR_ID, if given, as the engine's executor id), prints ``ready`` once
the workflow's step runs, and lets the step end when stdin closes; then prints
the workflow's result and its claims' reasons as one JSON line. The liveness
tests run it where another executor of the same host may misjudge it dead
(another pid namespace; a restart under a fixed executor id).
"""

from __future__ import annotations

import asyncio
import json
import sys

import durably


@durably.step
async def hold() -> str:
    """Say ``ready``, then wait for stdin to close: the workflow stays running meanwhile."""
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    return "done"


@durably.workflow(name="live.held")
async def held() -> str:
    return await hold()


async def main(url: str, workflow_id: str, executor_id: str | None) -> None:
    async with durably.Engine(url, lease_seconds=30.0, executor_id=executor_id) as engine:
        handle = await engine.start(held, workflow_id=workflow_id)
        result = await handle.result(timeout=60)
        claims = [c.reason for c in await engine.claims(workflow_id)]
    print(json.dumps({"result": result, "claims": claims}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
