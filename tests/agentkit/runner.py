"""The child process of the agent tests: start (or re-attach to) the support workflow.

    python -m tests.agentkit.runner --db PATH --id ID --input TEXT [--until waiting]

Prints one JSON line: ``{"status": ..., "result": ...}``. With ``--until
waiting`` it exits as soon as the workflow parks waiting (for an approval),
leaving it to another process. ``DURABLY_CRASH_AT`` may SIGKILL it earlier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import durably


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    from tests.agentkit import flows  # after the environment names the model server

    engine = durably.Engine(f"sqlite:///{ns.db}", hold_seconds=0.05, poll_interval=0.1)
    try:
        async with engine:
            flow = {
                "anthropic": flows.support_anthropic,
                "team": flows.support_team,
                "verdict": flows.support_verdict,
            }.get(ns.flow, flows.support)
            handle = await engine.start(flow, ns.input, workflow_id=ns.id)
            if ns.until:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + ns.timeout
                while (status := await handle.status()) != ns.until:
                    if loop.time() > deadline or durably.Status(status).finished:
                        return {"status": status}
                    await asyncio.sleep(0.05)
                return {"status": status}
            try:
                result = await handle.result(timeout=ns.timeout)
            except Exception as exc:
                return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            return {"status": "completed", "result": result}
    finally:
        await flows.client.close()
        await flows.anthropic_client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.agentkit.runner")
    parser.add_argument("--db", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--input", default="help")
    parser.add_argument("--until", default=None)
    parser.add_argument(
        "--flow", default="openai", choices=["openai", "anthropic", "team", "verdict"]
    )
    parser.add_argument("--timeout", type=float, default=30.0)
    ns = parser.parse_args(argv)
    out = asyncio.run(run(ns))
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
