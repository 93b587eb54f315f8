"""A workflow that ends ``cancelled`` has run its compensations, each once (SQLite file).

README ("Cancel is final"), ``durably.compensate`` and docs/side-effects.md
("Compensation"): if the workflow fails or is cancelled, the registered
compensations run as steps, newest first, and it still ends ``cancelled``;
a cancel is final once committed, so a function that returns after it ends
``cancelled`` too. The three ways a cancelled workflow's function can end:
it catches ``Cancelled`` and returns, it lets ``Cancelled`` out (or re-raises
it), or the cancel lands during its last step and it returns with no durable
call on the way. Each undo appends a line to a file: the count is what ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
import durably.testing
from tests import cancel_flows
from tests.test_cancel_final import Workers

GATES: dict[str, asyncio.Event] = {}
EFFECTS = "DURABLY_TEST_UNDO_EFFECTS"


@pytest.fixture(autouse=True)
def _effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    GATES.clear()
    monkeypatch.setenv(EFFECTS, str(tmp_path / "effects.txt"))


def effects() -> list[str]:
    path = Path(os.environ[EFFECTS])
    return path.read_text().splitlines() if path.exists() else []


@durably.step
async def act(label: str) -> str:
    with open(os.environ[EFFECTS], "a") as out:
        out.write(f"do {label}\n")
    return label


@durably.step
async def undo(label: str) -> str:
    with open(os.environ[EFFECTS], "a") as out:
        out.write(f"undo {label}\n")
    return label


async def _book(wid: str) -> None:
    await act(f"{wid}:a")
    durably.compensate(undo, f"{wid}:a")
    await act(f"{wid}:b")
    durably.compensate(undo, f"{wid}:b")


@durably.step
async def held(wid: str) -> str:
    with open(os.environ[EFFECTS], "a") as out:
        out.write(f"holding {wid}\n")
    await GATES[wid].wait()  # the cancel is committed while this step runs
    return wid


@durably.workflow(name="test_cancel_compensations.catches")
async def catches(wid: str) -> str:
    await _book(wid)
    try:
        await durably.sleep(3600)  # the cancel is delivered here
    except durably.Cancelled:
        return "handled"
    return "slept"


@durably.workflow(name="test_cancel_compensations.reraises")
async def reraises(wid: str) -> str:
    await _book(wid)
    try:
        await durably.sleep(3600)
    except durably.Cancelled:
        await act(f"{wid}:cleanup")
        raise
    return "slept"


@durably.workflow(name="test_cancel_compensations.last_step")
async def last_step(wid: str) -> str:
    await _book(wid)
    return await held(wid)  # the cancel lands here; the function returns after it


def engine(url: str) -> durably.Engine:
    return durably.Engine(url, poll_interval=0.2, hold_seconds=0.05)


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _cancelled_run(url: str, flow: Any, wid: str) -> durably.WorkflowInfo:
    """Start ``flow``, cancel it once it has booked both, release it; its info at the end."""
    GATES[wid] = asyncio.Event()
    async with engine(url) as e:
        handle = await e.start(flow, wid, workflow_id=wid)

        async def booked() -> bool:  # parked on its sleep, or in its last step
            if f"holding {wid}" in effects():
                return True
            return [x.kind for x in await e.history(wid)][2:] == ["sleep"]

        await until(booked, f"{wid} to reach its wait or last step")
        assert await e.cancel(wid) == [wid]
        GATES[wid].set()
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=15)
        return await handle.info()


FLOWS = {"catches": catches, "reraises": reraises, "last_step": last_step}


@pytest.mark.parametrize("wid", list(FLOWS))
async def test_a_cancelled_workflow_runs_its_compensations_once(sqlite_url: str, wid: str) -> None:
    flow = FLOWS[wid]
    info = await _cancelled_run(sqlite_url, flow, wid)
    assert info.status == "cancelled"
    undone = [x for x in effects() if x.startswith("undo")]
    assert undone == [f"undo {wid}:b", f"undo {wid}:a"], effects()


# --- replayed: each compensation runs once --------------------------------------------------


def test_a_parked_workflow_cancelled_then_recovered_compensates_once(sqlite_url: str) -> None:
    """Parked on its sleep when the cancel is committed (no engine running); a new Engine
    replays it to the sleep, where it receives the cancel, catches it and returns. A
    rehearsal of the journal (``durably replay``) finds it replays as recorded."""
    info, kinds = asyncio.run(_parked_then_cancelled(sqlite_url))
    assert info.status == "cancelled"
    assert json.loads(info.output or "null") == "handled"
    assert effects() == ["do p:a", "do p:b", "undo p:b", "undo p:a"]
    assert kinds == ["step", "step", "cancel", "step", "step"]
    report = durably.testing.replay(database=sqlite_url)
    assert report.ok, [p.line() for p in report.problems]


async def _parked_then_cancelled(url: str) -> tuple[durably.WorkflowInfo, list[str]]:
    async with engine(url) as first:
        await first.start(catches, "p", workflow_id="p")
        await until(lambda: _status(first, "p", "sleeping"), "'p' to park on its sleep")
    with durably.Client(url) as client:
        assert client.cancel("p") == ["p"]
    async with engine(url) as second:
        with pytest.raises(durably.Cancelled):
            await second.handle("p").result(timeout=15)
        info = await second.get_workflow("p")
        kinds = [x.kind for x in await second.history("p")]
    async with engine(url) as third:  # one more recovery finds nothing to run
        await third.recover()
    return info, kinds


async def _status(e: durably.Engine, workflow_id: str, status: str) -> bool:
    return (await e.get_workflow(workflow_id)).status == status


@pytest.mark.slow
def test_a_cancel_after_the_last_call_compensates_once_across_a_sigkill(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The cancel is committed while the run is in plain code after its last durable call;
    it returns, and dies (SIGKILL) in its second compensation, after the first committed.
    The recovery replays the cancel and the first compensation, and runs the second."""
    kit = Workers(sqlite_url, tmp_path)
    try:
        first = kit.spawn()
        with durably.Client(sqlite_url) as client:
            client.start(cancel_flows.booked_late_return, "k", workflow_id="k")
            kit.wait_for(lambda: len(client.history("k")) == 2, "both bookings", first)
            assert client.cancel("k") == ["k"]
            kit.release("k")  # it returns 5: the cancel ends it, its undos run

            def first_undone() -> bool:
                return [e.kind for e in client.history("k")] == ["step", "step", "cancel", "step"]

            kit.wait_for(first_undone, "the first compensation's receipt", first)
            kit.kill(first)  # in the second compensation, waiting for its flag
            kit.release("undo-k:a")
            second = kit.spawn()
            kit.wait_for(lambda: client.get_workflow("k").finished, "'k' to finish", second)
            info = client.get_workflow("k")
            kinds = [e.kind for e in client.history("k")]
        assert info.status == "cancelled"
        assert json.loads(info.output or "null") == 5
        assert kit.effects() == ["k:a", "k:b", "undo k:b", "undo k:a"]
        assert kinds == ["step", "step", "cancel", "step", "step"]
        report = durably.testing.replay(database=sqlite_url)
        assert report.ok, [p.line() for p in report.problems]
    finally:
        kit.stop()
