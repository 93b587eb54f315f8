"""Deadlines (issue 14): ``@durably.workflow(timeout=...)`` and ``start(..., timeout=...)``.

A workflow past its deadline is cancelled wherever it is (parked on a sleep or
a signal, running a step or plain code, waiting on its queue), its children
included; the deadline is stored in its row, so it survives a SIGKILL of the
process that ran it. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably import cli
from durably.queues import Queue
from durably.server import views
from tests import cancel_flows
from tests.test_cancel_final import Workers, committed, until

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def engine(url: str, *queues: Queue, **kw: Any) -> durably.Engine:
    kw.setdefault("poll_interval", 0.2)
    kw.setdefault("hold_seconds", 0.05)
    return durably.Engine(url, queues=queues, **kw)


@durably.step
async def note(text: str) -> str:
    RAN.append(text)
    return text


@durably.workflow(name="td.sleeper", timeout=1.0)
async def sleeper() -> str:
    try:
        await note("before")
        await durably.sleep(30)
        return await note("after")
    finally:
        await note("cleanup")


@durably.workflow(name="td.waiter")
async def waiter() -> str:
    await note("waiting")
    payload = await durably.wait_for_signal("never")
    return await note(f"got {payload}")


@durably.workflow(name="td.busy")
async def busy(seconds: float, then_step: bool) -> int:
    await note("first")
    await asyncio.sleep(seconds)  # plain code: the deadline passes here
    if then_step:
        await note("second")
    return 5


@durably.workflow(name="td.parent", timeout=1.0)
async def parent() -> str:
    child = await durably.start_child(waiter, workflow_id="td-kid")
    result: str = await child.result()
    return await note(f"parent got {result}")


HANG: dict[str, asyncio.Event] = {}


@durably.step(at_most_once=True)
async def transfer(order_id: str) -> str:
    RAN.append(f"transfer {order_id}")
    if "hang" in HANG:
        await HANG["hang"].wait()
    return f"tr_{order_id}"


@durably.workflow(name="td.transfer")
async def transfer_flow(order_id: str) -> str:
    return await transfer(order_id)


@durably.workflow(name="td.queued")
async def queued(label: str) -> str:
    RAN.append(f"body {label}")
    return await note(f"step {label}")


async def cancelled_by_deadline(e: durably.Engine, wid: str) -> durably.WorkflowInfo:
    """Wait for ``wid`` to end; check it ended cancelled with its deadline named."""
    with pytest.raises(durably.Cancelled, match=r"its deadline .* passed"):
        await e.handle(wid).result(timeout=15)
    info = await e.get_workflow(wid)
    assert info.status == "cancelled"
    assert info.deadline_at is not None
    assert "its deadline" in json.loads(info.error or "{}")["message"]
    return info


# --- wherever it is ---------------------------------------------------------------------------


async def test_a_workflow_parked_on_a_sleep_is_cancelled_at_its_deadline(store_url: str) -> None:
    async with engine(store_url) as e:
        started = time.monotonic()
        await e.start(sleeper, workflow_id="s")
        info = await cancelled_by_deadline(e, "s")
        took = time.monotonic() - started
        kinds = [x.kind for x in await e.history("s")]
    assert info.deadline_at == pytest.approx(info.created_at + 1.0)
    assert took < 8.0, f"cancelled {took:.1f} s after the start (deadline: 1 s)"
    assert RAN == ["before", "cleanup"]  # the finally block ran; "after" never did
    assert "cancel" in kinds


async def test_a_workflow_parked_on_a_signal_is_cancelled_at_start_s_timeout(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        await e.start(waiter, workflow_id="w", timeout=0.8)
        await until(lambda: _ran("waiting"), "the wait to begin")
        info = await cancelled_by_deadline(e, "w")
    assert info.deadline_at == pytest.approx(info.created_at + 0.8)
    assert RAN == ["waiting"]


async def test_resume_of_a_workflow_its_deadline_cancelled_runs_it_without_one(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        await e.start(waiter, workflow_id="r", timeout=0.5)
        await cancelled_by_deadline(e, "r")
        await e.resume("r")
        assert (await e.get_workflow("r")).deadline_at is None
        await e.send_signal("r", "never", "late")
        assert await e.handle("r").result(timeout=15) == "got late"
    assert RAN == ["waiting", "got late"]


@pytest.mark.parametrize("then_step", [True, False], ids=["then-a-step", "then-return"])
async def test_a_running_workflow_is_cancelled_at_its_deadline(
    store_url: str, then_step: bool
) -> None:
    async with engine(store_url) as e:
        await e.start(busy, 1.5, then_step, workflow_id="b", timeout=0.5)
        info = await cancelled_by_deadline(e, "b")
    assert RAN == ["first"]  # the step after the deadline never ran
    if not then_step:
        assert json.loads(info.output or "null") == 5  # its result, kept for inspection


async def test_a_workflow_parked_for_review_is_cancelled_at_its_deadline(store_url: str) -> None:
    HANG["hang"] = asyncio.Event()
    first = engine(store_url)
    await first.open()
    try:  # stopped hard inside the at-most-once step: its intent has no receipt
        await first.start(transfer_flow, "O-1", workflow_id="t", timeout=2.0)
        await until(lambda: _ran("transfer O-1"), "the transfer to begin")
    finally:
        await first.close(drain_timeout=0.05)
        del HANG["hang"]
    async with engine(store_url) as second:  # nothing can tell whether it happened: review

        async def parked() -> bool:
            return (await second.get_workflow("t")).status == "needs_review"

        await until(parked, "the step to park for review")
        await cancelled_by_deadline(second, "t")
        assert await second.reviews("t") == []  # its review was closed, not left open
    assert RAN == ["transfer O-1"]


async def test_a_deadline_cancels_the_children_too(store_url: str) -> None:
    async with engine(store_url) as e:
        await e.start(parent, workflow_id="p")
        await until(lambda: _ran("waiting"), "the child to wait")
        parent_info = await cancelled_by_deadline(e, "p")
        kid = await e.get_workflow("td-kid")
        with pytest.raises(durably.Cancelled):
            await e.handle("td-kid").result(timeout=15)
        kid = await e.get_workflow("td-kid")
    assert kid.status == "cancelled"
    assert kid.deadline_at == parent_info.deadline_at  # a child's is no later than its parent's
    assert RAN == ["waiting"]


async def test_a_queued_workflow_past_its_deadline_never_starts(store_url: str) -> None:
    q = Queue("td-unserved")
    async with engine(store_url) as bystander:  # does not serve the queue
        await q.enqueue(bystander, queued, "late", workflow_id="late", timeout=0.3)

        async def cancelled() -> bool:
            return (await bystander.get_workflow("late")).status == "cancelled"

        await until(cancelled, "the queued workflow's deadline to cancel it")
        info = await cancelled_by_deadline(bystander, "late")
        assert info.deadline_at == pytest.approx(info.created_at + 0.3)
    async with engine(store_url, q) as server:
        nxt = await q.enqueue(server, queued, "next", workflow_id="next")
        assert await nxt.result(timeout=15) == "step next"
        assert await server.claims("late") == []
    assert RAN == ["body next", "step next"]


async def test_the_start_s_timeout_wins_and_a_workflow_without_one_has_no_deadline(
    store_url: str,
) -> None:
    with durably.Client(store_url) as client:
        client.start(sleeper, workflow_id="own")
        client.start(sleeper, workflow_id="given", timeout=datetime.timedelta(minutes=5))
        client.start(waiter, workflow_id="none")
        Queue("td-sync").enqueue_sync(client, waiter, workflow_id="q", timeout=60)
        rows = {w: client.get_workflow(w) for w in ("own", "given", "none", "q")}
    assert rows["own"].deadline_at == pytest.approx(rows["own"].created_at + 1.0)
    assert rows["given"].deadline_at == pytest.approx(rows["given"].created_at + 300)
    assert rows["none"].deadline_at is None
    assert rows["q"].deadline_at == pytest.approx(rows["q"].created_at + 60)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "5"])
async def test_a_bad_timeout_is_refused_naming_it_and_nothing_is_stored(
    store_url: str, bad: Any
) -> None:
    with durably.Client(store_url) as client:
        with pytest.raises(ValueError, match="timeout"):
            client.start(waiter, workflow_id="x", timeout=bad)
        assert client.list_workflows() == []
    with pytest.raises(durably.DefinitionError, match=r"workflow\(timeout\)"):
        durably.workflow(name="td.bad", timeout=bad)


# --- the deadline is shown ------------------------------------------------------------------


def test_show_and_the_json_api_show_the_deadline(store_url: str) -> None:
    with durably.Client(store_url) as client:
        client.start(waiter, workflow_id="shown", timeout=3600)
        info = client.get_workflow("shown")
    assert info.deadline_at is not None
    assert views.workflow(info)["deadline_at"] == info.deadline_at
    out = CliRunner().invoke(cli.main, ["--database", store_url, "show", "shown"])
    assert out.exit_code == 0, out.output
    assert "deadline" in out.output
    out = CliRunner().invoke(cli.main, ["--database", store_url, "show", "shown", "--json"])
    assert json.loads(out.output)["workflow"]["deadline_at"] == info.deadline_at


async def _ran(text: str) -> bool:
    return text in RAN


# --- kill and recover: the deadline is in the row ----------------------------------------------


@pytest.mark.slow
def test_a_deadline_that_passes_while_the_process_is_dead_cancels_on_recovery(
    store_url: str, tmp_path: Path
) -> None:
    kit = Workers(store_url, tmp_path)
    try:
        first = kit.spawn()
        with durably.Client(store_url) as client:
            client.start(cancel_flows.two_steps, "d", workflow_id="d", timeout=3.0)
            kit.wait_for(lambda: committed(client, "d"), "the first step's receipt", first)
            kit.kill(first)  # in plain code, between the two steps
            deadline = client.get_workflow("d").deadline_at
            assert deadline is not None
            while time.time() <= deadline:  # the restart comes after the deadline
                time.sleep(0.05)
            assert client.get_workflow("d").status == "running"  # nobody noticed yet
            kit.release("d")  # the plain code would now go on to the second step
            second = kit.spawn()
            kit.wait_for(lambda: client.get_workflow("d").finished, "'d' to finish", second)
            info = client.get_workflow("d")
        assert info.status == "cancelled"
        assert "its deadline" in json.loads(info.error or "{}")["message"]
        assert kit.effects() == ["d:before"]  # the step after the deadline never ran
    finally:
        kit.stop()
