"""A wake-up for a parked workflow that no run here holds (a signal sent to it, its
child ended) is claimed directly by id (``claim_woken``), not by a pass over every
claimable row; what a direct claim may not take (a queued workflow, another version)
is left to the pass, which keeps the queue's limits."""

from __future__ import annotations

import asyncio
from typing import Any

import durably
from durably import Queue

SENT: list[str] = []


@durably.step
async def note(label: str) -> str:
    SENT.append(label)
    return label


@durably.workflow(name="wake-claim.waiter")
async def waiter(label: str) -> str:
    got = await durably.wait_for_signal("go")
    return await note(f"{label}:{got}")


@durably.workflow(name="wake-claim.child")
async def child(label: str) -> str:
    await durably.wait_for_signal("go")
    return await note(label)


@durably.workflow(name="wake-claim.parent")
async def parent() -> str:
    handle = await durably.start_child(child, "kid", workflow_id="wake-claim-kid")
    return "parent saw " + await handle.result()


def watch_claims(engine: durably.Engine) -> dict[str, list[Any]]:
    """Record what ``claim_woken`` and ``claim_next`` answer (the store runs as is)."""
    store: Any = engine._store.store
    seen: dict[str, list[Any]] = {"woken": [], "next": []}
    woken, nxt = store.claim_woken, store.claim_next

    def claim_woken(owner: str, workflow_id: str, *args: Any) -> Any:
        info = woken(owner, workflow_id, *args)
        seen["woken"].append((workflow_id, None if info is None else info.workflow_id))
        return info

    def claim_next(*args: Any) -> Any:
        taken = nxt(*args)
        seen["next"].extend(info.workflow_id for info in taken)
        return taken

    store.claim_woken, store.claim_next = claim_woken, claim_next
    return seen


async def until(handle: durably.WorkflowHandle[Any], status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 15
    now = "not started"
    while True:
        try:
            if (now := await handle.status()) == status:
                return
        except durably.WorkflowNotFound:  # a child its parent has not started yet
            pass
        assert asyncio.get_running_loop().time() < deadline, f"still {now}"
        await asyncio.sleep(0.01)


async def test_a_signal_to_a_parked_workflow_claims_it_directly(store_url: str) -> None:
    SENT.clear()
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await engine.start(waiter, "a", workflow_id="wake-claim-a")
        await until(handle, "waiting")
        while "wake-claim-a" in engine._tasks:  # the parked run has let go
            await asyncio.sleep(0.01)
        seen = watch_claims(engine)
        await engine.send_signal("wake-claim-a", "go", "yes")
        assert await handle.result(timeout=15) == "a:yes"
        assert ("wake-claim-a", "wake-claim-a") in seen["woken"]
        assert "wake-claim-a" not in seen["next"]  # no pass took it
        claims = await engine.claims("wake-claim-a")
        assert [c.reason for c in claims] == ["start", "resume"]
    assert SENT == ["a:yes"]


async def test_a_child_that_ends_claims_its_parked_parent_directly(store_url: str) -> None:
    SENT.clear()
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await engine.start(parent, workflow_id="wake-claim-parent")
        kid = engine.handle("wake-claim-kid")
        await until(kid, "waiting")
        await until(handle, "waiting")
        while {"wake-claim-kid", "wake-claim-parent"} & set(engine._tasks):
            await asyncio.sleep(0.01)
        seen = watch_claims(engine)
        await engine.send_signal("wake-claim-kid", "go")
        assert await handle.result(timeout=15) == "parent saw kid"
        assert ("wake-claim-parent", "wake-claim-parent") in seen["woken"]
        assert "wake-claim-parent" not in seen["next"]
    assert SENT == ["kid"]


LIMITED = Queue("wake-claim-one-at-a-time", concurrency=1)
GATE: list[asyncio.Event] = []


@durably.step
async def hold_place() -> str:
    await GATE[0].wait()
    return "released"


@durably.workflow(name="wake-claim.blocker")
async def blocker() -> str:
    return await hold_place()


async def test_a_queued_workflow_woken_by_a_signal_still_waits_for_its_queue(
    store_url: str,
) -> None:
    SENT.clear()
    GATE[:] = [asyncio.Event()]
    async with durably.Engine(store_url, hold_seconds=0.0, queues=[LIMITED]) as engine:
        parked = await LIMITED.enqueue(engine, waiter, "q", workflow_id="wake-claim-q")
        await until(parked, "waiting")  # parked: its place in the queue is free
        holder = await LIMITED.enqueue(engine, blocker, workflow_id="wake-claim-holder")
        await until(holder, "running")  # the queue's one place, held by a running step
        seen = watch_claims(engine)
        await engine.send_signal("wake-claim-q", "go", "late")
        await asyncio.sleep(0.5)
        assert await parked.status() == "waiting"  # its queue has no place: not taken
        assert all(taken is None for wid, taken in seen["woken"] if wid == "wake-claim-q")
        assert "wake-claim-q" not in seen["next"]
        GATE[0].set()
        assert await holder.result(timeout=15) == "released"
        assert await parked.result(timeout=15) == "q:late"  # taken by a pass once free
        assert "wake-claim-q" in seen["next"]
    assert SENT == ["q:late"]
