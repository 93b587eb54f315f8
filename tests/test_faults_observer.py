"""The shipped crash kit observes the engine through ``faults.observe``; it patches nothing.

``durably test-crashes`` counts step calls and receipts in its child process.
It used to replace ``faults.reached``, ``step_call.invoke`` and ``Run.commit``
at run time, so a refactor that renamed or bypassed one of them silently broke
the counts. Now the engine reports to an observer; these tests run a real
workflow (SQLite and PostgreSQL) and read what the observer heard.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import faults, journal, step_call, workflow_run
from durably.testing import crash_child

ATTEMPTS: list[int] = []


@durably.step(retry=durably.Retry(max_attempts=2, initial=0.01, jitter=0))
async def flaky(x: int) -> int:
    ATTEMPTS.append(x)
    if len(ATTEMPTS) == 1:
        raise RuntimeError("first attempt fails")
    return x * 2


@durably.step
async def plain(x: int) -> int:
    return x + 1


@durably.workflow
async def observed(x: int) -> int:
    return await plain(await flaky(x))


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def reached(self, point: str, step: str) -> None:
        self.events.append(("reached", point, step))

    def step_called(self, step: Any, ctx: Any) -> None:
        self.events.append(("called", step.name, ctx.seq, ctx.attempt))

    def committed(self, workflow_id: str, entries: Sequence[journal.Entry]) -> None:
        for e in entries:
            self.events.append(("committed", workflow_id, e.name, e.status))


@pytest.fixture
def heard() -> Iterator[Heard]:
    ATTEMPTS.clear()
    observer = Heard()
    faults.observe(observer)
    try:
        yield observer
    finally:
        faults.observe(None)


async def test_the_observer_hears_every_boundary_call_and_receipt(
    store_url: str, heard: Heard
) -> None:
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(observed, 5, workflow_id="obs")
        assert await handle.result(timeout=30) == 11
    calls = [e for e in heard.events if e[0] == "called"]
    assert calls == [
        ("called", "flaky", 1, 1),
        ("called", "flaky", 1, 2),
        ("called", "plain", 2, 1),
    ]
    receipts = [e for e in heard.events if e[0] == "committed" and e[3] == "completed"]
    assert receipts == [
        ("committed", "obs", "flaky", "completed"),
        ("committed", "obs", "plain", "completed"),
    ]
    points = [(e[1], e[2]) for e in heard.events if e[0] == "reached"]
    assert ("engine_start", "") in points
    assert points.count(("before_call", "flaky")) == 2
    assert points[-2:] == [("before_finish", "observed"), ("after_finish", "observed")]
    # each call is heard before it is made, each receipt after the call
    first_receipt = heard.events.index(receipts[0])
    assert heard.events.index(calls[1]) < first_receipt


def test_the_crash_child_records_without_replacing_engine_functions(
    sqlite_url: str, tmp_path: Path
) -> None:
    originals = (faults.reached, step_call.invoke, workflow_run.Run.commit)
    ATTEMPTS.clear()
    config = {
        "dir": str(tmp_path),
        "target": f"{__name__}:observed",
        "call": json.dumps({"args": [5], "kwargs": {}}),
        "workflow_id": "child",
        "database_url": sqlite_url,
        "until": [],
        "timeout": 30,
    }
    try:
        assert crash_child.main(json.dumps(config), None) == 0
    finally:
        faults.observe(None)
    assert (faults.reached, step_call.invoke, workflow_run.Run.commit) == originals
    lines = (tmp_path / crash_child.CALLS_FILE).read_text().splitlines()
    calls = [json.loads(line) for line in lines]
    assert [(c["event"], c["step"]) for c in calls] == [
        ("call", "flaky"),
        ("call", "flaky"),
        ("receipt", "flaky"),
        ("call", "plain"),
        ("receipt", "plain"),
    ]
    assert calls[0]["policy"] == "plain" and calls[0]["key"] == "child:1"
    trace_text = (tmp_path / crash_child.TRACE_FILE).read_text()
    trace = [json.loads(line) for line in trace_text.splitlines()]
    assert trace[0]["point"] == "engine_start" and trace[-1]["point"] == "after_finish"
