"""``resume`` of a workflow still waiting on its queue starts it now, bypassing the
queue's wait (as DBOS does); on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durably
from durably.queues import Queue

GATE: dict[str, asyncio.Event] = {}
RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    GATE.clear()


@durably.step
async def hold(label: str) -> str:
    RAN.append(label)
    if label == "blocker":
        await GATE["open"].wait()
    return label


@durably.workflow(name="test_resume_enqueued.job")
async def job(label: str) -> str:
    return await hold(label)


def engine(url: str, *queues: Queue, **kw: Any) -> durably.Engine:
    kw.setdefault("poll_interval", 0.1)
    kw.setdefault("hold_seconds", 0.05)
    return durably.Engine(url, queues=queues, **kw)


async def until(predicate: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_resume_starts_a_queued_workflow_past_its_queue_limit(store_url: str) -> None:
    GATE["open"] = asyncio.Event()
    q = Queue("trq-one", concurrency=1)
    async with engine(store_url, q) as e:
        try:
            await resume_past_the_blocker(e, q)
        finally:
            GATE["open"].set()
    assert RAN == ["blocker", "next"]


async def resume_past_the_blocker(e: durably.Engine, q: Queue) -> None:
    """The blocker fills the queue; the resumed one runs beside it."""
    await q.enqueue(e, job, "blocker", workflow_id="blocker")
    await until(lambda: _has(RAN, "blocker"), "the blocker to run")
    waiting = await q.enqueue(e, job, "next", workflow_id="next")
    assert await waiting.status() == "pending"  # the queue is full
    handle = await e.resume("next")
    assert await handle.result(timeout=10) == "next"  # while the blocker still runs
    assert await e.handle("blocker").status() == "running"
    GATE["open"].set()
    assert await e.handle("blocker").result(timeout=10) == "blocker"


async def test_client_resume_of_a_workflow_on_a_queue_nobody_serves(store_url: str) -> None:
    q = Queue("trq-unserved")
    with durably.Client(store_url) as client:
        wid = q.enqueue_sync(client, job, "late", workflow_id="late")
        client.resume(wid)
        info = client.get_workflow(wid)
        assert info.status == "pending"
    async with engine(store_url) as e:  # serves no queue: the workflow no longer waits on one
        assert await e.handle("late").result(timeout=10) == "late"
    assert RAN == ["late"]


async def test_resume_still_refuses_a_running_or_completed_workflow(store_url: str) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(job, "x", workflow_id="done")).result(timeout=10) == "x"
        with pytest.raises(durably.DurablyError, match="is completed"):
            await e.resume("done")


async def _has(items: list[str], item: str) -> bool:
    return item in items
