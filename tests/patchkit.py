"""The child process of the patch tests: one workflow whose code changes between runs.

    python -m tests.patchkit URL WORKFLOW_ID EFFECTS

``PATCHKIT_CODE`` picks the code this process has: ``old`` (no patch), ``new``
(``durably.patched("fix-1")`` chooses the path) or ``deprecated``
(``durably.deprecate_patch("fix-1")`` and the new path only). With
``PATCHKIT_HANG=PATH`` the ``hang`` step touches PATH and sleeps, for the test
to SIGKILL the process there. Every step call appends a line to EFFECTS. Prints
one JSON line: ``{"ok": true, "result": [...]}`` or the error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import durably

CODE = os.environ.get("PATCHKIT_CODE", "old")
EFFECTS = Path(os.environ.get("PATCHKIT_EFFECTS", "effects.jsonl"))


def _effect(name: str) -> None:
    with EFFECTS.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": name, "pid": os.getpid()}) + "\n")


@durably.step
def first() -> str:
    _effect("first")
    return "first"


@durably.step
def old_path() -> str:
    _effect("old_path")
    return "old_path"


@durably.step
def new_path() -> str:
    _effect("new_path")
    return "new_path"


@durably.step
def hang() -> str:
    _effect("hang")
    marker = os.environ.get("PATCHKIT_HANG")
    if marker:
        Path(marker).touch()
        time.sleep(60)
    return "hang"


@durably.step
def last() -> str:
    _effect("last")
    return "last"


@durably.workflow(name="patchkit")
async def patchkit() -> list[str]:
    out = [await first()]
    if CODE == "old":
        out.append(await old_path())
    elif CODE == "new":
        if durably.patched("fix-1"):
            out.append(await new_path())
        else:
            out.append(await old_path())
        # a second call with the same id gives the same answer, and journals nothing
        out.append(f"patched={durably.patched('fix-1')}")
    else:
        durably.deprecate_patch("fix-1")
        out.append(await new_path())
        out.append("patched=True")
    out.append(await hang())
    out.append(await last())
    return out


async def main(url: str, workflow_id: str) -> dict[str, Any]:
    async with durably.Engine(url, lease_seconds=2.0) as engine:
        handle = await engine.start(patchkit, workflow_id=workflow_id)
        try:
            return {"ok": True, "result": await handle.result(timeout=60)}
        except Exception as exc:
            return {"ok": False, "error_type": type(exc).__name__, "message": str(exc)}


if __name__ == "__main__":
    EFFECTS = Path(sys.argv[3])
    out = asyncio.run(main(sys.argv[1], sys.argv[2]))
    sys.stdout.write(json.dumps(out) + "\n")
