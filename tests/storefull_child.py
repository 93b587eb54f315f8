"""A child process that runs one workflow into a file-size limit (a full disk, for SQLite).

    python -m tests.storefull_child --db PATH --effects PATH --phase full [--lift]
    python -m tests.storefull_child --db PATH --effects PATH --phase resume

``full``: opens an engine (1 s lease) on the SQLite file, then lowers this
process's file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored, as ``ulimit -f``
does) to a little above the database's files, and starts ``big_result``: its
step appends one line to the effects file, then returns 2 MB that cannot fit.
After ``--full-seconds`` (several leases) it reads the workflow's status,
journal and claims. With ``--lift`` it then raises the limit again (space
returns) and waits for the workflow to finish; without, it SIGKILLs itself.
``resume``: opens an engine without any limit and waits for the workflow.

Prints one JSON line on stdout with what it saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import sys
from typing import Any

import durably

WORKFLOW_ID = "full-1"
EFFECTS_ENV = "STOREFULL_EFFECTS"


@durably.step
def big_step() -> str:
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())
    return "x" * 2_000_000


@durably.workflow
async def big_result() -> int:
    return len(await big_step())


def _sizes(db: str) -> int:
    return max(os.path.getsize(db + s) for s in ("", "-wal", "-shm") if os.path.exists(db + s))


async def full(ns: argparse.Namespace) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with durably.Engine(f"sqlite:///{ns.db}", lease_seconds=1.0) as engine:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (_sizes(ns.db) + 256 * 1024, hard))
        handle = await engine.start(big_result, workflow_id=WORKFLOW_ID)
        try:
            seen["result_while_full"] = await handle.result(timeout=ns.full_seconds)
        except TimeoutError:
            seen["result_while_full"] = None
        info = await engine.get_workflow(WORKFLOW_ID)
        seen["status_while_full"] = info.status
        seen["crash_count_while_full"] = info.crash_count
        seen["journal_while_full"] = [e.status for e in await engine.history(WORKFLOW_ID)]
        seen["claims_while_full"] = len(await engine.claims(WORKFLOW_ID))
        if not ns.lift:
            print(json.dumps(seen), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        seen["result"] = await handle.result(timeout=60)
        seen["status"] = await handle.status()
    return seen


async def resume(ns: argparse.Namespace) -> dict[str, Any]:
    async with durably.Engine(f"sqlite:///{ns.db}", lease_seconds=1.0) as engine:
        handle = engine.handle(WORKFLOW_ID)
        return {"result": await handle.result(timeout=60), "status": await handle.status()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--phase", choices=["full", "resume"], required=True)
    parser.add_argument("--full-seconds", type=float, default=5.0)
    parser.add_argument("--lift", action="store_true")
    ns = parser.parse_args()
    os.environ[EFFECTS_ENV] = ns.effects
    seen = asyncio.run(full(ns) if ns.phase == "full" else resume(ns))
    print(json.dumps(seen), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
