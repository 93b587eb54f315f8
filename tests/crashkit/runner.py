"""The child process of the crash tests: start (or re-attach to) one workflow and wait.

    python -m tests.crashkit.runner --db PATH --workflow NAME --id ID \\
        --args JSON --effects PATH [--lease-seconds S] [--max-recoveries N]

Opens ``durably.Engine("sqlite:///" + PATH)`` (which recovers orphaned work on
entry), starts the workflow ``NAME`` of :mod:`tests.crashkit.flows` under ``ID``
(idempotent: an existing id re-attaches), waits for it to finish and prints one
JSON line on stdout: ``{"ok": true, "result": ...}`` or ``{"ok": false,
"error_type": ..., "message": ...}`` when the workflow ended in an error. Exits
0 in both cases; crash injection (``DURABLY_CRASH_AT``) SIGKILLs it earlier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import durably
from tests.crashkit import flows


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    wf = getattr(flows, ns.workflow)
    args = json.loads(ns.args)
    engine = durably.Engine(
        "sqlite:///" + ns.db,
        lease_seconds=ns.lease_seconds,
        max_recoveries=ns.max_recoveries,
    )
    async with engine:
        handle = await engine.start(wf, *args, workflow_id=ns.id)
        try:
            result = await handle.result(timeout=ns.timeout)
        except TimeoutError:
            raise
        except Exception as exc:
            return {"ok": False, "error_type": type(exc).__name__, "message": str(exc)}
        return {"ok": True, "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.crashkit.runner")
    parser.add_argument("--db", required=True)
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--args", default="[]")
    parser.add_argument("--effects", required=True)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--max-recoveries", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0)
    ns = parser.parse_args(argv)
    os.environ[flows.EFFECTS_ENV] = ns.effects
    out = asyncio.run(run(ns))
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
