"""One engine process running one workflow of ``tests.messagingkit.flows``.

    python -m tests.messagingkit.child URL WORKFLOW ID [ARGS_JSON]

Starts the workflow under ID (an existing ID re-attaches: the engine claims it
when its owner is dead), waits for its result and prints one JSON line,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``. A crash
plan comes from ``DURABLY_CRASH_AT`` (see durably.faults).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import durably
from tests.messagingkit import flows


async def main(url: str, workflow: str, workflow_id: str, args: list[Any]) -> dict[str, Any]:
    async with durably.Engine(url, hold_seconds=0.1, poll_interval=0.2) as engine:
        handle = await engine.start(getattr(flows, workflow), *args, workflow_id=workflow_id)
        try:
            return {"ok": True, "result": await handle.result(timeout=60)}
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    url, workflow, workflow_id = sys.argv[1:4]
    args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
    print(json.dumps(asyncio.run(main(url, workflow, workflow_id, args))), flush=True)
