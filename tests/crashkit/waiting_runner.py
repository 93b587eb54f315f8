"""The child process of the waiting crash tests: run one workflow of ``waiting_flows``.

    python -m tests.crashkit.waiting_runner --db PATH --workflow NAME --id ID \\
        --args JSON --effects PATH [--hold-seconds S] [--poll-interval S] \\
        [--lease-seconds S] [--attach] [--timeout S]

Like :mod:`tests.crashkit.runner`, but on :mod:`tests.crashkit.waiting_flows`
and with the Engine options that matter for waiting (``hold_seconds``,
``poll_interval``). It starts ``NAME`` under ``ID`` (idempotent: an existing id
re-attaches), or with ``--attach`` only waits for the existing workflow ``ID``
(which the engine claims like any other), and prints one JSON line:
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_type": ..., "message": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import durably
from tests.crashkit import flows, waiting_flows


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    engine = durably.Engine(
        "sqlite:///" + ns.db,
        lease_seconds=ns.lease_seconds,
        poll_interval=ns.poll_interval,
        hold_seconds=ns.hold_seconds,
    )
    async with engine:
        if ns.attach:
            handle = engine.handle(ns.id)
        else:
            wf = getattr(waiting_flows, ns.workflow)
            handle = await engine.start(wf, *json.loads(ns.args), workflow_id=ns.id)
        try:
            result = await handle.result(timeout=ns.timeout)
        except TimeoutError:
            raise
        except Exception as exc:
            return {"ok": False, "error_type": type(exc).__name__, "message": str(exc)}
        return {"ok": True, "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.crashkit.waiting_runner")
    parser.add_argument("--db", required=True)
    parser.add_argument("--workflow", default="")
    parser.add_argument("--id", required=True)
    parser.add_argument("--args", default="[]")
    parser.add_argument("--effects", required=True)
    parser.add_argument("--hold-seconds", type=float, default=1.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--attach", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    ns = parser.parse_args(argv)
    if not ns.attach and not ns.workflow:
        parser.error("--workflow is required unless --attach")
    os.environ[flows.EFFECTS_ENV] = ns.effects
    out = asyncio.run(run(ns))
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
