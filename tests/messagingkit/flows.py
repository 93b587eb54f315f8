"""The workflows of tests/test_messaging_crashes.py, run in child processes.

Every step appends one JSON line per invocation to the file named by
``MSG_EFFECTS`` (flushed and fsynced before it acts further: a SIGKILL cannot
lose it), so a test counts what really ran. Names start with ``mk.``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import durably

EFFECTS = "MSG_EFFECTS"


def record(label: str) -> None:
    """Append this invocation (label, workflow, pid) to the effects file."""
    line = {"label": label, "wf": durably.workflow_id(), "pid": os.getpid(), "t": time.time()}
    with open(os.environ[EFFECTS], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@durably.step
def mk_step(label: str, seconds: float) -> str:
    """Record ``label``, take ``seconds``, record ``label end``."""
    record(label)
    time.sleep(seconds)
    record(f"{label} end")
    return label


@durably.workflow(name="mk.race")
async def race() -> list[Any]:
    index, value = await durably.wait_first(mk_step("loser", 3.0), mk_step("winner", 0.3))
    await mk_step(f"after {index}", 0.0)
    return [index, value]


@durably.workflow(name="mk.signal_race")
async def signal_race() -> list[Any]:
    index, value = await durably.wait_first(
        durably.wait_for_signal("a"), durably.wait_for_signal("b")
    )
    return [index, value, await durably.wait_for_signal("b", timeout=2.0)]


@durably.workflow(name="mk.target")
async def target() -> list[Any]:
    first = await durably.wait_for_signal("go")
    second = await durably.wait_for_signal("go", timeout=0.5)
    return [first, second]


@durably.workflow(name="mk.sender")
async def sender(to: str) -> str:
    await durably.send_signal(to, "go", {"from": durably.workflow_id()})
    await mk_step("after send", 0.0)
    return "sent"


@durably.step
def mk_progress() -> str:
    record("progress")
    durably.set_event("progress", durably.step_info().attempt)
    return "ok"


@durably.workflow(name="mk.step_event")
async def step_event() -> str:
    return await mk_progress()
