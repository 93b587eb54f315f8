"""Queues, issue 14: a delayed enqueue, a child on a queue, partitioned queues, a debouncer.

Each is user-facing behaviour on SQLite and PostgreSQL, with counted effects:
a step records when it ran (``RAN``), and the claims table says when each
workflow was first taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import errors
from durably.queues import Queue
from durably.storage import base, create_store
from tests import children, test_store

#: label -> [(start, end)] of every run of ``mark``, in monotonic time.
RAN: dict[str, list[tuple[float, float]]] = {}
#: label -> how many times ``fan_out`` started (its code ran, replays included).
REPLAYS: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    REPLAYS.clear()


@durably.step
async def mark(label: str, seconds: float) -> str:
    start = time.monotonic()
    await asyncio.sleep(seconds)
    RAN.setdefault(label, []).append((start, time.monotonic()))
    return label


@durably.workflow(name="test_queue_features.job")
async def job(label: str, seconds: float = 0.0) -> str:
    return await mark(label, seconds)


def engine(url: str, *queues: Queue, **kw: Any) -> durably.Engine:
    kw.setdefault("poll_interval", 0.1)
    return durably.Engine(url, queues=queues, **kw)


async def first_claim_delay(e: durably.Engine, workflow_id: str) -> float:
    """Seconds from the workflow's creation to its first claim (both stamped by the store)."""
    info = await e.handle(workflow_id).info()
    claims = await e.claims(workflow_id)
    return claims[0].claimed_at - info.created_at


# --- 1. delay ---------------------------------------------------------------------------


async def test_a_delayed_enqueue_does_not_start_before_its_delay(store_url: str) -> None:
    q = Queue("tqf-delay")
    async with engine(store_url, q) as e:
        late = await q.enqueue(e, job, "late", delay=1.0)
        soon = await q.enqueue(e, job, "soon")
        assert await soon.result(timeout=10) == "soon"
        assert await late.status() == "pending"
        assert (await late.info()).wake_at is not None
        assert await late.result(timeout=10) == "late"
        assert await first_claim_delay(e, late.workflow_id) >= 1.0
    assert sorted(RAN) == ["late", "soon"] and len(RAN["late"]) == 1


async def test_a_delay_through_a_client_enqueue_sync_and_start(store_url: str) -> None:
    q = Queue("tqf-delay-sync")
    with durably.Client(store_url) as client:
        queued = q.enqueue_sync(client, job, "queued", delay=0.8)
        plain = client.start(job, "plain", delay=0.8)
    async with engine(store_url, q) as e:
        assert await e.handle(queued).result(timeout=10) == "queued"
        assert await e.handle(plain).result(timeout=10) == "plain"
        assert await first_claim_delay(e, queued) >= 0.8
        assert await first_claim_delay(e, plain) >= 0.8
    assert {k: len(v) for k, v in RAN.items()} == {"queued": 1, "plain": 1}


async def test_resume_starts_a_delayed_enqueue_now(store_url: str) -> None:
    q = Queue("tqf-delay-resume")
    async with engine(store_url, q) as e:
        later = await q.enqueue(e, job, "resumed", delay=3600)
        await e.resume(later.workflow_id)
        assert await later.result(timeout=10) == "resumed"
        assert await first_claim_delay(e, later.workflow_id) < 60
    assert {k: len(v) for k, v in RAN.items()} == {"resumed": 1}


async def test_a_delayed_start_on_an_engine(store_url: str) -> None:
    async with engine(store_url) as e:
        later = await e.start(job, "later", delay=0.8)
        assert await later.status() == "pending"
        assert await later.result(timeout=10) == "later"
        assert await first_claim_delay(e, later.workflow_id) >= 0.8
        with pytest.raises(ValueError, match="delay"):
            await e.start(job, "never", delay=-1)
    assert {k: len(v) for k, v in RAN.items()} == {"later": 1}


async def test_a_bad_delay_is_refused_before_anything_is_stored(store_url: str) -> None:
    q = Queue("tqf-delay-bad")
    with durably.Client(store_url) as client:
        for bad in (-1, float("nan"), float("inf"), "5", True):
            with pytest.raises(ValueError, match="delay"):
                q.enqueue_sync(client, job, "x", delay=bad)
        assert client.list_workflows() == []


# --- 2. a child on a queue ----------------------------------------------------------------


@durably.workflow(name="test_queue_features.fan_out")
async def fan_out(n: int, queue: str) -> list[str]:
    REPLAYS["fan_out"] = REPLAYS.get("fan_out", 0) + 1
    handles = [await durably.start_child(job, f"child-{i}", 0.3, queue=queue) for i in range(n)]
    return [await h.result() for h in handles]


async def test_a_child_on_a_queue_waits_its_turn_and_starts_once(store_url: str) -> None:
    q = Queue("tqf-children", concurrency=1)
    async with engine(store_url, q, hold_seconds=0.0) as e:
        parent = await e.start(fan_out, 3, q.name, workflow_id="parent")
        assert await parent.result(timeout=30) == ["child-0", "child-1", "child-2"]
        with durably.Client(store_url) as client:
            kids = client.list_workflows(parent_id="parent")
        assert sorted(w.workflow_id for w in kids) == ["parent:1", "parent:2", "parent:3"]
        assert {w.queue for w in kids} == {q.name}
        for kid in kids:
            assert [c.reason for c in await e.claims(kid.workflow_id)] == ["start"]
        # the parent parked while its children waited, and was replayed from its journal
        assert len(await e.claims("parent")) >= 2
    assert REPLAYS["fan_out"] >= 2
    assert {k: len(v) for k, v in RAN.items()} == {f"child-{i}": 1 for i in range(3)}
    spans = sorted(span for runs in RAN.values() for span in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # concurrency 1: never two children at once


CHILD_QUEUE = Queue("tqf-child-object")


@durably.workflow(name="test_queue_features.child_on")
async def child_on(queue: str | None) -> str:
    handle = await durably.start_child(job, "only", queue=CHILD_QUEUE if queue is None else queue)
    result: str = await handle.result()
    return result


async def test_a_child_takes_a_queue_object_and_refuses_a_bad_queue(store_url: str) -> None:
    async with engine(store_url, CHILD_QUEUE) as e:
        good = await e.start(child_on, None)
        assert await good.result(timeout=10) == "only"
        with durably.Client(store_url) as client:
            (child,) = client.list_workflows(parent_id=good.workflow_id)
        assert child.queue == CHILD_QUEUE.name
        bad = await e.start(child_on, "")
        with pytest.raises(durably.InvalidName, match="queue"):
            await bad.result(timeout=10)


# --- 3. partitioned queues ----------------------------------------------------------------


async def test_a_partitioned_queue_limits_each_key_on_its_own(store_url: str) -> None:
    q = Queue("tqf-partitioned", concurrency=1, partition=True)
    async with engine(store_url, q) as e:
        a1 = await q.enqueue(e, job, "acme-1", 0.8, partition_key="acme")
        a2 = await q.enqueue(e, job, "acme-2", 0.0, partition_key="acme")
        b1 = await q.enqueue(e, job, "bolt-1", 0.8, partition_key="bolt")
        for h in (a1, a2, b1):
            await h.result(timeout=20)
    ((a1_start, a1_end),) = RAN["acme-1"]
    ((a2_start, _),) = RAN["acme-2"]
    ((b1_start, b1_end),) = RAN["bolt-1"]
    assert b1_start < a1_end and a1_start < b1_end  # two keys side by side
    assert a2_start >= a1_end  # one key's second item waited for its first


async def test_a_partitioned_queue_needs_a_key_and_a_plain_one_refuses_it(store_url: str) -> None:
    parted = Queue("tqf-parted-strict", concurrency=1, partition=True)
    plain = Queue("tqf-plain-strict", concurrency=1)
    with durably.Client(store_url) as client:
        with pytest.raises(errors.QueueOptionError, match="partition_key"):
            parted.enqueue_sync(client, job, "x")
        with pytest.raises(errors.QueueOptionError, match="partition"):
            plain.enqueue_sync(client, job, "x", partition_key="acme")
        with pytest.raises(durably.InvalidName, match="partition_key"):
            parted.enqueue_sync(client, job, "x", partition_key="a\x00b")
        assert client.list_workflows() == []
    assert repr(parted) == "Queue('tqf-parted-strict', concurrency=1, partition=True)"
    with pytest.raises(durably.DefinitionError, match="needs concurrency"):
        Queue("tqf-parted-unlimited", partition=True)
    with pytest.raises(durably.DefinitionError, match="partition"):
        Queue("tqf-parted-bad", concurrency=1, partition="yes")  # type: ignore[arg-type]


# --- 4. debouncer ---------------------------------------------------------------------------


async def test_a_debounced_burst_runs_only_its_last_enqueue(store_url: str) -> None:
    q = Queue("tqf-debounce")
    async with engine(store_url, q) as e:
        burst = [
            await q.enqueue(e, job, f"save-{i}", debounce="doc-1", delay=0.8) for i in range(5)
        ]
        other = await q.enqueue(e, job, "other-doc", debounce="doc-2", delay=0.8)
        last = burst[-1]
        assert await last.result(timeout=10) == "save-4"
        assert await other.result(timeout=10) == "other-doc"
        for h, later in itertools.pairwise(burst):
            assert await h.status() == "cancelled"
            with pytest.raises(errors.Superseded, match=later.workflow_id):
                await h.result(timeout=5)
        assert await first_claim_delay(e, last.workflow_id) >= 0.8
        for h in burst[:-1]:
            assert await e.claims(h.workflow_id) == []  # never started
        # A started workflow is not superseded: the next burst is a run of its own.
        again = await q.enqueue(e, job, "save-5", debounce="doc-1", delay=0.2)
        assert await again.result(timeout=10) == "save-5"
    assert {k: len(v) for k, v in RAN.items()} == {"save-4": 1, "other-doc": 1, "save-5": 1}


async def test_a_debounce_through_a_client_and_its_checks(store_url: str) -> None:
    q = Queue("tqf-debounce-sync")
    with durably.Client(store_url) as client:
        ids = [q.enqueue_sync(client, job, f"v{i}", debounce="k", delay=0.5) for i in range(3)]
        with pytest.raises(errors.QueueOptionError, match="delay"):
            q.enqueue_sync(client, job, "x", debounce="k")
        with pytest.raises(durably.InvalidName, match="debounce"):
            q.enqueue_sync(client, job, "x", debounce="a\x00", delay=1)
        assert [client.get_workflow(w).status for w in ids] == ["cancelled", "cancelled", "pending"]
    async with engine(store_url, q) as e:
        assert await e.handle(ids[-1]).result(timeout=10) == "v2"
        with pytest.raises(durably.Cancelled, match="superseded"):
            await e.handle(ids[0]).result(timeout=5)
    assert {k: len(v) for k, v in RAN.items()} == {"v2": 1}


def test_a_parent_killed_while_its_queued_children_wait_starts_each_once(
    store_url: str, tmp_path: Path
) -> None:
    """SIGKILL the process while the first child runs and the others wait on the queue;
    a second process finishes: three children, each created once, in queue order."""
    effects = tmp_path / "effects"
    effects.touch()
    argv = children.python("-m", "tests.queue_children_flows", store_url, str(effects))
    env = children.child_env()
    with subprocess.Popen(argv, cwd=children.REPO, env=env, stdout=subprocess.PIPE) as first:
        deadline = time.monotonic() + 60
        while "c0" not in effects.read_text():
            assert first.poll() is None, "the first process ended before its first child ran"
            assert time.monotonic() < deadline, "timed out waiting for the first child to run"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
    with durably.Client(store_url) as client:
        queued = client.list_workflows(parent_id="parent")
        assert sorted(w.status for w in queued) == ["pending", "pending", "running"]
    done = subprocess.run(argv, cwd=children.REPO, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == ["c0", "c1", "c2"]
    ran = effects.read_text().split()
    # c0 was killed inside its step and ran again; the others ran once, after it, in order
    assert ran in (["c0", "c0", "c1", "c2"], ["c0", "c1", "c2"])
    with durably.Client(store_url) as client:
        kids = client.list_workflows(parent_id="parent")
        assert sorted(w.workflow_id for w in kids) == ["parent:1", "parent:2", "parent:3"]
        for kid in kids:
            assert kid.queue == "qcc-children" and kid.status == "completed"
            assert client.claims(kid.workflow_id)[0].reason == "start"


def test_concurrent_debounced_enqueues_leave_exactly_one(store_url: str) -> None:
    """Four clients enqueue under one debounce key at once: the queue's row lock makes them
    take turns, so one workflow is left pending and every other one is superseded."""
    q = Queue("tqf-debounce-race")
    start = threading.Barrier(4)
    made: list[str] = []

    def burst(n: int) -> None:
        with durably.Client(store_url) as client:
            start.wait()
            for i in range(5):
                made.append(q.enqueue_sync(client, job, f"{n}-{i}", debounce="k", delay=30))

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(made) == 20
    with durably.Client(store_url) as client:
        statuses = sorted(client.get_workflow(w).status for w in made)
    assert statuses == ["cancelled"] * 19 + ["pending"]


async def test_a_delayed_enqueue_starts_when_due_not_at_the_next_poll(store_url: str) -> None:
    """The engine's look for work waits for the end of the delay (the store's next wake-up),
    so a delayed workflow starts then, although the poll interval is far longer."""
    q = Queue("tqf-delay-due")
    async with engine(store_url, q, poll_interval=60.0) as e:
        await asyncio.sleep(0.3)  # the engine's first look for work is over: it waits now
        handle = await q.enqueue(e, job, "due", delay=0.5)
        assert await handle.result(timeout=15) == "due"
        waited = await first_claim_delay(e, handle.workflow_id)
    assert 0.5 <= waited < 5.0


PARTED = Queue("tqf-child-parted", concurrency=1, partition=True)


@durably.workflow(name="test_queue_features.parted_children")
async def parted_children(keys: list[str | None]) -> list[str]:
    handles = [
        await durably.start_child(job, f"{k}-{i}", 0.6, queue=PARTED, partition_key=k)
        for i, k in enumerate(keys)
    ]
    return [await h.result() for h in handles]


async def test_children_on_a_partitioned_queue_are_limited_per_key(store_url: str) -> None:
    async with engine(store_url, PARTED) as e:
        parent = await e.start(parted_children, ["acme", "acme", "bolt"])
        assert await parent.result(timeout=30) == ["acme-0", "acme-1", "bolt-2"]
        keyless = await e.start(parted_children, [None])
        with pytest.raises(errors.QueueOptionError, match="partition_key"):
            await keyless.result(timeout=10)
    ((a0_start, a0_end),) = RAN["acme-0"]
    ((a1_start, _),) = RAN["acme-1"]
    ((b2_start, b2_end),) = RAN["bolt-2"]
    assert b2_start < a0_end and a0_start < b2_end  # two keys side by side
    assert a1_start >= a0_end  # one key's second child waited for its first
    assert "None-0" not in RAN


# --- the store verbs under these features ----------------------------------------------


def test_a_claim_pass_takes_at_most_the_limit_of_each_partition(store_url: str) -> None:
    """One claim_next over a partitioned queue: the candidates of one key ahead of another
    count against its limit within the same pass (not only the running ones)."""
    store = create_store(store_url)
    store.open()
    try:
        db = test_store.Verbs(store)
        limits = base.QueueLimits("parted", concurrency=2, partitioned=True)
        now = test_store.NOW
        for i in range(12):
            key = "abc"[i % 3]
            test_store.queued(db, f"{key}{i}", "parted", now + i, partition_key=key)
        taken = test_store.claim_next(db, "ex-a", now + 20, limit=100, queues=[limits])
        assert taken == ["a0", "b1", "c2", "a3", "b4", "c5"]
        assert test_store.claim_next(db, "ex-b", now + 20, limit=100, queues=[limits]) == []
        test_store.queued(db, "d99", "parted", now + 21, partition_key="d")
        assert test_store.claim_next(db, "ex-b", now + 22, queues=[limits]) == ["d99"]
    finally:
        store.close()


def test_a_delayed_pending_workflow_is_claimed_at_its_wake_up_and_not_before(
    store_url: str,
) -> None:
    store = create_store(store_url)
    store.open()
    try:
        db = test_store.Verbs(store)
        now = test_store.NOW
        test_store.queued(db, "later", "llm", now, delay=5.0)
        db.create_workflow(
            dataclasses.replace(test_store.new("plain-later"), delay=7.0), None, None, now
        )
        limits = base.QueueLimits("llm")
        assert db.next_wake() == now + 5.0
        assert test_store.claim_next(db, "ex-a", now + 4.9, queues=[limits]) == []
        assert test_store.claim_next(db, "ex-a", now + 5.0, queues=[limits]) == ["later"]
        assert db.next_wake() == now + 7.0
        assert test_store.claim_next(db, "ex-a", now + 6.9) == []
        assert test_store.claim_next(db, "ex-a", now + 7.0) == ["plain-later"]
        assert db.next_wake() is None
    finally:
        store.close()
