"""The child process of ``crash_points``: probes on, a crash plan set, one workflow run.

It records every commit boundary the engine reaches, every call of a step
function and every committed receipt (one ``O_APPEND`` write each, so a SIGKILL
cannot tear a line) through the observer hook of :mod:`durably.faults` (it
replaces nothing of the engine), then starts or re-attaches to the workflow and
waits until it settles.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durably import journal

if TYPE_CHECKING:
    from durably.context import StepContext
    from durably.steps import StepDefinition

TRACE_FILE = "boundaries.jsonl"
CALLS_FILE = "calls.jsonl"
FINISHED = frozenset(journal.FINISHED_STATUSES)


def _append(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line with a single write on an O_APPEND descriptor (SIGKILL-safe)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, default=str) + "\n").encode())
    finally:
        os.close(fd)


class Probes:
    """A :class:`durably.faults.Observer` that writes what the engine does to ``folder``.

    Every boundary goes to ``boundaries.jsonl``; every call of a step function
    (before it is made) and every committed step receipt to ``calls.jsonl``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pid = os.getpid()
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def reached(self, point: str, step: str) -> None:
        self.seen[(point, step)] += 1
        record = {"pid": self.pid, "point": point, "step": step, "nth": self.seen[(point, step)]}
        _append(self.folder / TRACE_FILE, record)

    def step_called(self, step: StepDefinition, ctx: StepContext) -> None:
        if step.reconcile is not None:
            policy = "reconcile"
        else:
            policy = "at_most_once" if step.at_most_once else "plain"
        _append(
            self.folder / CALLS_FILE,
            {
                "event": "call",
                "pid": self.pid,
                "workflow_id": ctx.workflow_id,
                "seq": ctx.seq,
                "step": step.name,
                "attempt": ctx.attempt,
                "key": ctx.idempotency_key,
                "policy": policy,
            },
        )

    def committed(self, workflow_id: str, entries: Sequence[journal.Entry]) -> None:
        for e in entries:  # durable now: a later call at this seq re-ran a completed step
            if e.kind == journal.Kind.STEP and e.status == journal.EntryStatus.COMPLETED:
                _append(
                    self.folder / CALLS_FILE,
                    {
                        "event": "receipt",
                        "pid": self.pid,
                        "workflow_id": workflow_id,
                        "seq": e.seq,
                        "step": e.name,
                    },
                )


def _load(target: str) -> Any:
    import importlib

    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(config_json: str, crash_at: str | None) -> int:
    """The child: probes on, crash plan set, then run the workflow until it settles."""
    import asyncio

    from durably import codec, faults

    config = json.loads(config_json)
    folder = Path(config["dir"])
    faults.observe(Probes(folder))
    if crash_at:
        os.environ["DURABLY_CRASH_AT"] = crash_at
    faults.configure(crash_at)
    try:
        wf = _load(config["target"])
    except (ImportError, AttributeError) as exc:
        sys.stderr.write(f"cannot load {config['target']!r}: {exc}\n")
        return 2
    call = codec.decode(config["call"], where="crash test arguments")
    assert isinstance(call, dict)
    status = asyncio.run(
        _drive(
            wf,
            call["args"],
            call["kwargs"],
            config["workflow_id"],
            config["database_url"],
            set(config["until"]),
            float(config["timeout"]),
        )
    )
    sys.stdout.write(json.dumps({"workflow_id": config["workflow_id"], "status": status}) + "\n")
    return 0 if status is not None else 3


async def _drive(
    wf: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    workflow_id: str,
    url: str,
    until: set[str],
    timeout: float,
) -> str | None:
    import asyncio

    from durably import Engine

    async with Engine(url) as engine:
        handle = await engine.start(wf, *args, workflow_id=workflow_id, **kwargs)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            status = await handle.status()
            if status in FINISHED or status in until:
                return str(status)
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.1)
    sys.stderr.write(f"workflow {workflow_id!r} did not settle within {timeout}s\n")
    return None
