"""Queues: enqueue, limits that hold across workers, priorities, deduplication.

In one process on each backend first, then across worker processes: a queue
with global concurrency 3 never has more than 3 calls in flight at the fake
payments service (its high-water mark, with a delay), and a rate limit holds
(the claim times in the database).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.queues import Queue
from durably.testing.payments import FakePaymentsServer
from tests import multiworker
from tests import multiworker_flows as flows

RUNNING: dict[str, int] = {"now": 0, "most": 0}
ORDER: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RUNNING.update(now=0, most=0)
    ORDER.clear()


@durably.step
async def busy(label: str, seconds: float) -> str:
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    ORDER.append(label)
    try:
        await asyncio.sleep(seconds)
    finally:
        RUNNING["now"] -= 1
    return label


@durably.workflow(name="test_queues.job")
async def job(label: str, seconds: float = 0.0) -> str:
    return await busy(label, seconds)


def engine(url: str, *queues: Queue, **kw: Any) -> durably.Engine:
    kw.setdefault("poll_interval", 0.1)
    return durably.Engine(url, queues=queues, **kw)


async def test_enqueued_work_runs_on_an_engine_that_serves_the_queue(store_url: str) -> None:
    q = Queue("tq-basic")
    async with engine(store_url) as bystander:
        handle = await q.enqueue(bystander, job, "a", workflow_id="a")
        info = await handle.info()
        assert (info.status, info.queue, info.owner) == ("pending", "tq-basic", None)
        # Work without a queue, started after it from another connection, is claimed by the
        # bystander's own look for work: once that is done, it has seen "a" and left it.
        with durably.Client(store_url) as client:
            client.start(job, "plain", workflow_id="plain")
        assert await bystander.handle("plain").result(timeout=10) == "plain"
        assert (await bystander.claims("plain"))[0].owner == bystander.executor_id
        assert await handle.status() == "pending"  # not served here
        async with engine(store_url, q) as server:
            assert await server.handle("a").result(timeout=10) == "a"
    assert ORDER == ["plain", "a"]


async def test_enqueue_sync_through_a_client_and_deduplication(store_url: str) -> None:
    q = Queue("tq-dedup")
    with durably.Client(store_url) as client:
        first = q.enqueue_sync(client, job, "one", deduplication_id="doc-1")
        again = q.enqueue_sync(client, job, "two", deduplication_id="doc-1")
        assert again == first  # the unfinished one holds the id
        assert q.enqueue_sync(client, job, "x", workflow_id="fixed") == "fixed"
        assert q.enqueue_sync(client, job, "y", workflow_id="fixed") == "fixed"
        with pytest.raises(durably.WorkflowIdConflict):
            q.enqueue_sync(client, "another.workflow", workflow_id="fixed")
    async with engine(store_url, q) as e:
        assert await e.handle(first).result(timeout=10) == "one"
        assert await e.handle("fixed").result(timeout=10) == "x"
        third = await q.enqueue(e, job, "three", deduplication_id="doc-1")
        assert third.workflow_id != first  # a finished workflow frees the id
        assert await third.result(timeout=10) == "three"
    assert sorted(ORDER) == ["one", "three", "x"]


async def test_worker_concurrency_bounds_one_engine(store_url: str) -> None:
    q = Queue("tq-two-at-a-time", worker_concurrency=2)
    async with engine(store_url, q) as e:
        handles = [await q.enqueue(e, job, f"j{i}", 0.15) for i in range(6)]
        assert [await h.result(timeout=20) for h in handles] == [f"j{i}" for i in range(6)]
    assert RUNNING["most"] == 2


async def test_higher_priority_first_then_older(store_url: str) -> None:
    q = Queue("tq-priority", concurrency=1)
    with durably.Client(store_url) as client:
        for label, priority in [("low-1", 0), ("high", 9), ("low-2", 0), ("mid", 5)]:
            q.enqueue_sync(client, job, label, priority=priority, workflow_id=label)
            time.sleep(0.01)  # distinct creation times
    async with engine(store_url, q) as e:
        for label in ("high", "mid", "low-1", "low-2"):
            await e.handle(label).result(timeout=10)
    assert ORDER == ["high", "mid", "low-1", "low-2"]


async def test_a_parked_workflow_frees_its_place(store_url: str) -> None:
    q = Queue("tq-park", concurrency=1)

    async with engine(store_url, q, hold_seconds=0.0) as e:
        sleeper = await q.enqueue(e, nap_then_job, "sleeper", workflow_id="sleeper")
        while await sleeper.status() != "sleeping":
            await asyncio.sleep(0.02)
        other = await q.enqueue(e, job, "other")
        assert await other.result(timeout=10) == "other"  # ran while the sleeper slept
        assert await sleeper.result(timeout=10) == "sleeper"
    assert ORDER == ["other", "sleeper"]


@durably.workflow(name="test_queues.nap_then_job")
async def nap_then_job(label: str) -> str:
    await durably.sleep(0.6)
    return await busy(label, 0.0)


def test_queue_definitions_are_checked() -> None:
    with pytest.raises(durably.DefinitionError, match="concurrency"):
        Queue("bad", concurrency=0)
    with pytest.raises(durably.DefinitionError, match="rate_limit"):
        Queue("bad", rate_limit=(0, 1.0))
    with pytest.raises(ValueError, match="once"):
        durably.Engine("sqlite:///unused.db", queues=[Queue("twice"), Queue("twice")])
    assert Queue.named("twice") is not None
    assert repr(Queue("shown", concurrency=2)) == "Queue('shown', concurrency=2)"


# --- across worker processes --------------------------------------------------------------------


@pytest.mark.slow
def test_global_concurrency_holds_across_four_workers(store_url: str, tmp_path: Path) -> None:
    count = 16
    poll = 0.5 if store_url.startswith("postgres") else 0.1
    server = FakePaymentsServer(tmp_path / "payments.jsonl", delay=0.3).start()
    try:
        with multiworker.pool(
            store_url, tmp_path, server.url, poll=poll, queues=[flows.LLM.name]
        ) as workers:
            workers.start(4)
            with durably.Client(store_url) as client:
                ids = [flows.LLM.enqueue_sync(client, flows.llm_call, n) for n in range(count)]
            workers.wait_for(lambda: multiworker.all_done(store_url, ids), "all done", 60)
            with durably.Client(store_url) as client:
                owners = {c.owner for wid in ids for c in client.claims(wid)}
                assert all(client.get_workflow(wid).status == "completed" for wid in ids)
        print(f"\nconcurrency 3 over 4 workers: high-water mark {server.max_in_flight}")
        assert server.max_in_flight == 3  # never more, and the room was used
        assert len(owners) >= 3  # one at a time per worker: three of them ran it at once
    finally:
        server.stop()


@pytest.mark.slow
def test_a_rate_limit_holds_across_four_workers(store_url: str, tmp_path: Path) -> None:
    count = 12
    limit, per = flows.RATED.rate_limit or (0, 0.0)
    poll = 0.5 if store_url.startswith("postgres") else 0.1
    with FakePaymentsServer(tmp_path / "payments.jsonl") as server, multiworker.pool(
        store_url, tmp_path, server.url, poll=poll, queues=[flows.RATED.name]
    ) as workers:  # fmt: skip
        workers.start(4)
        with durably.Client(store_url) as client:
            ids = [flows.RATED.enqueue_sync(client, flows.llm_call, n) for n in range(count)]
        workers.wait_for(lambda: multiworker.all_done(store_url, ids), "all done", 60)
        with durably.Client(store_url) as client:
            starts = sorted(
                c.claimed_at for wid in ids for c in client.claims(wid) if c.reason == "start"
            )
    assert len(starts) == count
    for i, t in enumerate(starts):
        within = [s for s in starts[i:] if s < t + per]
        assert len(within) <= limit, (t, within)
    span = starts[-1] - starts[0]
    print(f"\n{count} starts at most {limit} per {per}s over 4 workers: spread over {span:.1f}s")
    assert span >= (count // limit - 1) * per * 0.99
