"""A wake-up for a parked workflow that no run here holds (a signal sent to it, its
child ended) is claimed directly by id (``claim_woken``), not by a pass over every
claimable row; what a direct claim may not take (a queued workflow, another version)
is left to the pass, which keeps the queue's limits."""

from __future__ import annotations

import asyncio
from typing import Any

import durably
from durably import Queue, journal

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
    at_once = store.take_at_once

    def take_at_once(workflow_id: str, *args: Any) -> Any:
        done = at_once(workflow_id, *args)  # PostgreSQL's one round trip (pg_wakeup)
        if done is not None and (done.sent or done.taken is not None):
            taken = None if done.taken is None else done.taken.workflow_id
            seen["woken"].append((workflow_id, taken))
        return done

    store.take_at_once = take_at_once
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


def ops_of(engine: durably.Engine, verbs: tuple[str, ...]) -> list[tuple[str, int]]:
    """(verb, the number of the batch or inline call it ran in) for each call of ``verbs``:
    a batch of the store is one transaction, an inline call one op of its own."""
    store: Any = engine._store.store
    seen: list[tuple[str, int]] = []
    current = [0]
    for runner in ("run_batch", "run_inline"):
        real_runner = getattr(store, runner)

        def run(arg: Any, _real: Any = real_runner) -> Any:
            current[0] += 1
            return _real(arg)

        setattr(store, runner, run)
    for verb in verbs:
        real_verb = getattr(store, verb)

        def call(*args: Any, _real: Any = real_verb, _verb: str = verb, **kw: Any) -> Any:
            seen.append((_verb, current[0]))
            return _real(*args, **kw)

        setattr(store, verb, call)
    real_at_once = store.take_at_once

    def at_once(workflow_id: str, signal: Any, *args: Any) -> Any:
        # The verbs PostgreSQL's one round trip stands for (pg_wakeup), in its one op;
        # where it declines (None) the verbs are called, and seen, one by one.
        woken = real_at_once(workflow_id, signal, *args)
        if woken is not None:
            # (a duplicate that took nothing: its claim's statement changed nothing)
            done = ["send_signal"] if signal is not None else []
            if woken.sent or woken.taken:
                done.append("claim_woken")
            if woken.taken is not None:
                done.append("load_history")
            if woken.received is not None:
                done.append("receive_parked_signal")
            seen.extend((verb, current[0]) for verb in done if verb in verbs)
        return woken

    store.take_at_once = at_once
    return seen


async def test_the_engine_that_sends_the_signal_takes_the_workflow_in_the_same_commit(
    store_url: str,
) -> None:
    SENT.clear()
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await engine.start(waiter, "b", workflow_id="wake-claim-b")
        await until(handle, "waiting")
        while "wake-claim-b" in engine._tasks:
            await asyncio.sleep(0.01)
        seen = ops_of(engine, ("send_signal", "claim_woken", "load_history", "claim_next"))
        assert await engine.send_signal("wake-claim-b", "go", "now") is True
        assert await handle.result(timeout=15) == "b:now"
        first = [(verb, n) for verb, n in seen if verb != "claim_next"][:3]
        assert [verb for verb, _ in first] == ["send_signal", "claim_woken", "load_history"]
        assert len({n for _, n in first}) == 1, seen  # one op: one transaction
    assert SENT == ["b:now"]


@durably.workflow(name="wake-claim.twice")
async def twice() -> list[str]:
    return [await durably.wait_for_signal("go"), await durably.wait_for_signal("go")]


async def parked(engine: durably.Engine, handle: durably.WorkflowHandle[Any]) -> None:
    """Until the workflow is waiting and no run of it is left here."""
    await until(handle, "waiting")
    while handle.workflow_id in engine._tasks:
        await asyncio.sleep(0.01)


async def test_a_duplicate_signal_takes_nothing(store_url: str) -> None:
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await engine.start(twice, workflow_id="wake-claim-twice")
        await parked(engine, handle)
        assert await engine.send_signal("wake-claim-twice", "go", "one", idempotency_key="k")
        await asyncio.sleep(0.05)
        await parked(engine, handle)  # it took the first and waits for the second
        seen = ops_of(engine, ("claim_woken", "claim_next"))
        assert not await engine.send_signal("wake-claim-twice", "go", "one", idempotency_key="k")
        assert seen == []  # a signal that was not kept wakes nothing
        assert await handle.status() == "waiting"
        assert await engine.send_signal("wake-claim-twice", "go", "two")
        assert await handle.result(timeout=15) == ["one", "two"]


async def test_a_cancelled_sender_still_leaves_the_workflow_running(store_url: str) -> None:
    """The send, the claim and the launch are one shielded piece: cancelling the caller
    once the commit is on its way leaves no workflow claimed and not running."""
    SENT.clear()
    async with durably.Engine(store_url, hold_seconds=0.0, inline_commits=False) as engine:
        handle = await engine.start(waiter, "d", workflow_id="wake-claim-d")
        await parked(engine, handle)
        sending = asyncio.create_task(engine.send_signal("wake-claim-d", "go", "cut"))
        await asyncio.sleep(0)  # the commit is on the store thread now
        sending.cancel()
        # its run goes on here at once, not after the lease of a claim nobody runs
        assert await handle.result(timeout=5) == "d:cut"
    assert SENT == ["d:cut"]


@durably.workflow(name="wake-claim.napper")
async def napper() -> str:
    await durably.sleep(0.4)
    return "rested"


@durably.workflow(name="wake-claim.listener")
async def listener(n: int) -> int:
    for _ in range(n):
        await durably.wait_for_signal("go")
    return n


async def test_a_stream_of_wake_ups_does_not_keep_due_work_waiting(postgres_url: str) -> None:
    """Wake-ups claimed directly, one after another, still let a pass run at least once
    a poll interval: a sleeper parked by an engine that went away wakes on time."""
    async with durably.Engine(postgres_url, hold_seconds=0.0) as other:
        sleeper = await other.start(napper, workflow_id="wake-claim-napper")
        await until(sleeper, "sleeping")
    async with durably.Engine(postgres_url, hold_seconds=0.0, poll_interval=1.0) as engine:
        busy = await engine.start(listener, 10_000, workflow_id="wake-claim-busy")
        await until(busy, "waiting")
        with durably.Client(postgres_url) as client:  # its signals wake `engine` by NOTIFY

            async def keep_sending() -> None:
                while True:
                    await asyncio.to_thread(client.send_signal, "wake-claim-busy", "go")
                    await asyncio.sleep(0.02)

            sending = asyncio.create_task(keep_sending())
            try:
                napping = engine.handle("wake-claim-napper")
                assert await napping.result(timeout=4) == "rested"
            finally:
                sending.cancel()


async def test_a_signal_sent_as_the_run_parks_still_takes_it_in_one_commit(
    store_url: str,
) -> None:
    """Sent the moment the row says waiting, while the run here may still be letting go:
    the engine waits for it to go (moments), then takes the workflow with the signal."""
    SENT.clear()
    async with durably.Engine(store_url, hold_seconds=0.1) as engine:  # parks after a hold
        for label in ("e1", "e2", "e3"):
            handle = await engine.start(waiter, label, workflow_id=f"wake-claim-{label}")
            await until(handle, "waiting")  # not waiting for the run to be gone
            seen = ops_of(engine, ("send_signal", "claim_woken"))
            assert await engine.send_signal(handle.workflow_id, "go", "x")
            assert await handle.result(timeout=15) == f"{label}:x"
            assert [verb for verb, _ in seen[:2]] == ["send_signal", "claim_woken"], seen
            assert seen[0][1] == seen[1][1], seen  # in one op
    assert SENT == ["e1:x", "e2:x", "e3:x"]


HELD: list[asyncio.Event] = []


@durably.workflow(name="wake-claim.held")
async def held_waiter() -> list[Any]:
    await HELD[0].wait()  # workflow code: a re-run is held here, before its first wait
    first = await durably.wait_for_signal("go")
    return [first, await durably.wait_for_signal("go", timeout=0.3)]


async def held_and_parked(
    engine: durably.Engine, wf: Any, workflow_id: str
) -> durably.WorkflowHandle[Any]:
    """Start ``wf`` (a workflow that waits on ``HELD[0]`` first), let it park, and hold
    its next run there, before its first wait."""
    HELD[:] = [asyncio.Event()]
    HELD[0].set()
    handle = await engine.start(wf, workflow_id=workflow_id)
    await parked(engine, handle)
    HELD[0].clear()
    return handle


def signal_waits(history: list[Any]) -> list[tuple[str, Any]]:
    return [(e.status, e.payload) for e in history if e.kind == "signal"]


async def test_the_claim_that_takes_the_workflow_receives_the_signal_too(store_url: str) -> None:
    """A workflow parked on a signal wait alone receives the signal in the sender's
    commit: the journal holds the wait completed while the re-run has not reached it,
    and the run replays it (no commit of its own). The signal is received once."""
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await held_and_parked(engine, held_waiter, "wake-claim-held")
        verbs = ("send_signal", "claim_woken", "receive_parked_signal", "receive_signal")
        seen = ops_of(engine, verbs)
        assert await engine.send_signal("wake-claim-held", "go", "paid") is True
        claim = ["send_signal", "claim_woken", "receive_parked_signal"]
        assert [verb for verb, _ in seen][:3] == claim, seen
        assert len({n for _, n in seen}) == 1, seen  # one op: one transaction
        assert signal_waits(await engine.history("wake-claim-held")) == [("completed", '"paid"')]
        assert await handle.status() == "running"  # held before the wait it received
        HELD[0].set()
        assert await handle.result(timeout=15) == ["paid", None]  # not received twice
        # the run's own receive_signal calls were for the second wait only
        assert [verb for verb, n in seen if n != seen[0][1]].count("receive_signal") >= 1
        assert signal_waits(await engine.history("wake-claim-held")) == [
            ("completed", '"paid"'),
            ("timed_out", None),
        ]


async def test_a_signal_from_another_process_is_received_with_the_claim(
    postgres_url: str,
) -> None:
    """Sent by a Client (a NOTIFY wakes the engine), the engine's claim by id receives it."""
    async with durably.Engine(postgres_url, hold_seconds=0.0) as engine:
        handle = await held_and_parked(engine, held_waiter, "wake-claim-held-pg")
        seen = ops_of(engine, ("claim_woken", "receive_parked_signal"))
        with durably.Client(postgres_url) as client:
            assert await asyncio.to_thread(client.send_signal, handle.workflow_id, "go", 7)
        await until(handle, "running")
        deadline = asyncio.get_running_loop().time() + 15
        while signal_waits(await engine.history(handle.workflow_id))[0][0] != "completed":
            assert asyncio.get_running_loop().time() < deadline, seen
            await asyncio.sleep(0.01)
        assert [verb for verb, _ in seen][:2] == ["claim_woken", "receive_parked_signal"], seen
        assert seen[0][1] == seen[1][1], seen
        HELD[0].set()
        assert await handle.result(timeout=15) == [7, None]


@durably.workflow(name="wake-claim.either")
async def either() -> str:
    index, got = await durably.wait_first(durably.wait_for_signal("go"), durably.sleep(60))
    return f"{index}:{got}"


async def test_a_workflow_parked_on_more_than_a_signal_receives_it_in_its_run(
    store_url: str,
) -> None:
    """Parked on a signal and a sleep at once, the claim leaves the signal to the run."""
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await engine.start(either, workflow_id="wake-claim-either")
        await parked(engine, handle)
        seen = ops_of(engine, ("send_signal", "claim_woken", "receive_signal"))
        assert await engine.send_signal("wake-claim-either", "go", 1)
        assert await handle.result(timeout=15) == "0:1"
        assert [verb for verb, _ in seen][:2] == ["send_signal", "claim_woken"], seen
        assert "receive_signal" in [verb for verb, _ in seen[2:]]
        assert all(n != seen[0][1] for verb, n in seen if verb == "receive_signal"), seen


def signal_wake_ups(listener: Any, timeout: float, *, first: bool = False) -> list[Any]:
    """The ``signal`` wake-ups a LISTENing connection receives within ``timeout`` (with
    ``first``: until the first one)."""
    from durably.storage import sqlbase

    got = []
    for note in listener.notifies(timeout=timeout):
        wakeup = sqlbase.decode_wakeup(note.payload)
        if wakeup.kind == "signal":
            got.append(wakeup)
            if first:
                break
    return got


async def test_a_signal_the_sender_takes_wakes_no_other_executor(postgres_url: str) -> None:
    """Told of a signal whose workflow the sender took in the same commit, every other
    executor would try to claim it and look for work; a signal the sender could not
    take (its queue is full) still tells them."""
    import psycopg

    SENT.clear()
    GATE[:] = [asyncio.Event()]
    async with durably.Engine(postgres_url, hold_seconds=0.0, queues=[LIMITED]) as engine:
        channel = engine._store.store.channel
        with psycopg.connect(postgres_url, autocommit=True) as listener:
            listener.execute(f'LISTEN "{channel}"')
            handle = await engine.start(waiter, "t", workflow_id="wake-claim-taken")
            await parked(engine, handle)
            assert await engine.send_signal("wake-claim-taken", "go", "mine")
            assert await handle.result(timeout=15) == "t:mine"
            assert await asyncio.to_thread(signal_wake_ups, listener, 0.5) == []

            queued = await LIMITED.enqueue(engine, waiter, "u", workflow_id="wake-claim-untaken")
            await parked(engine, queued)
            holder = await LIMITED.enqueue(engine, blocker, workflow_id="wake-claim-holds")
            await until(holder, "running")  # its queue's one place is taken
            assert await engine.send_signal("wake-claim-untaken", "go", "later")
            told = await asyncio.to_thread(signal_wake_ups, listener, 10.0, first=True)
            assert [(w.workflow_id, w.name) for w in told] == [("wake-claim-untaken", "go")]
            GATE[0].set()
            assert await queued.result(timeout=15) == "u:later"
    assert SENT == ["t:mine", "u:later"]


def test_a_claim_leaves_the_signal_to_a_workflow_asked_to_stop(store_url: str) -> None:
    """Asked to stop (a cancel, a passed deadline), a parked workflow is claimed to stop,
    but the claim does not receive its signal: its run meets the cancel at the wait and
    the signal is left unconsumed. Without a cancel the same claim receives it."""
    from durably import operations
    from durably.storage import create_store
    from tests.test_store import LEASE, NOW, RUNNABLE, Verbs, owned

    store = create_store(store_url)
    store.open()
    try:
        db = Verbs(store)
        claim = operations.Claimer("ex-b", list(RUNNABLE), LEASE, {})
        for wid, stop in (("asked", True), ("not-asked", False)):
            info = owned(db, wid)
            wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
            db.park(wid, info.epoch, "waiting", None, [wait], ["go"], [], NOW)
            if stop:
                db.request_cancel(wid, NOW)
            assert db.send_signal(wid, "go", '"x"', None, NOW)
            woken = db.run(operations.take_woken, store, wid, NOW + 1, claim)
            assert woken.taken is not None and woken.taken.owner == "ex-b"
            [entry] = db.load_history(wid)
            consumed = [s["consumed_seq"] for s in db.list_signals(wid)]
            if stop:
                assert woken.received is None and entry.status == "started"
                assert consumed == [None]
            else:
                assert woken.received == entry and entry.status == "completed"
                assert (entry.payload, consumed) == ('"x"', [1])
    finally:
        store.close()
