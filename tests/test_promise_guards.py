"""Guards for promises that a one-line break once survived (issue 15, item 8).

Each test here was written against a mutation of src/durably that the rest of
the suite did not notice:

- park without its "has the signal already arrived?" check: a signal sent from
  another process while the workflow is still held in memory was slept through;
- a heartbeat renewing every ``lease * 3`` instead of ``lease / 3``: a healthy
  run's lease expired under it;
- ``synchronous=normal`` as the SQLite default: commits stopped surviving power loss.

Writing the first found a bug: a wake-up in the same loop iteration as the park
parked the workflow `sleeping` with none of its waits (fixed in workflow_run.Run._park_now).

Signals and leases run on both backends (``store_url``); the pragma is SQLite's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import pytest

import durably
from durably.storage import create_store
from tests import children

# --- a signal from another process while the workflow is held in memory ---------------

STEP_DONE: dict[str, asyncio.Event] = {}


@durably.step
async def ready(workflow_id: str) -> str:
    return workflow_id


@durably.workflow
async def wait_for_go(workflow_id: str) -> Any:
    await ready(workflow_id)
    event = STEP_DONE.get(workflow_id)
    if event is not None:
        event.set()  # the step is committed; the next line blocks on the signal
    return await durably.wait_for_signal("go")


def _env() -> dict[str, str]:
    return children.child_env()


SENDER = """
import json, sys
import durably

with durably.Client(sys.argv[1]) as client:
    print("ready", flush=True)
    for line in sys.stdin:
        workflow_id, payload = line.split(" ", 1)
        client.send_signal(workflow_id, "go", json.loads(payload))
        print("sent", flush=True)
"""


class Sender:
    """Another process holding a Client, started ahead so that a send costs milliseconds
    rather than an interpreter's start-up: the moment a signal lands is the test's."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, url: str) -> Sender:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SENDER,
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_env(),
        )
        sender = cls(proc)
        assert await sender._line() == "ready"
        return sender

    async def _line(self) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout=60)
        assert line, f"the sender process ended (exit {await self.proc.wait()})"
        return line.decode().strip()

    async def send(self, workflow_id: str, payload: Any) -> None:
        """Send signal "go"; returns once the other process has committed it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{workflow_id} {json.dumps(payload)}\n".encode())
        await self.proc.stdin.drain()
        assert await self._line() == "sent"

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert await asyncio.wait_for(self.proc.wait(), timeout=60) == 0


async def test_a_signal_from_another_process_reaches_a_workflow_held_in_memory(
    store_url: str,
) -> None:
    """The signal is committed while the run is blocked in memory (row `running`, not yet
    parked); when the run parks, park sees the signal is already there and looks again.

    On SQLite nothing else tells the run (no cross-process notification): without
    the check in park the workflow parks `waiting` and sleeps through its signal.
    """
    hold = 3.0
    STEP_DONE["held"] = asyncio.Event()
    sender = await Sender.start(store_url)
    try:
        async with durably.Engine(store_url, hold_seconds=hold, poll_interval=0.2) as e:
            handle = await e.start(wait_for_go, "held", workflow_id="held")
            await asyncio.wait_for(STEP_DONE["held"].wait(), timeout=30)
            blocked_at = time.monotonic()
            before = await handle.info()
            assert (before.status, before.owner) == ("running", e.executor_id)
            await sender.send("held", {"v": 7})
            sent_after = time.monotonic() - blocked_at
            assert sent_after < hold, f"the signal took {sent_after:.1f}s; the run parked first"
            after = await handle.info()
            # still held in memory (SQLite), or already done (PostgreSQL's NOTIFY pokes the
            # run): never parked with the signal unread
            assert after.status in ("running", "completed"), after.status
            assert await handle.result(timeout=hold + 20) == {"v": 7}
            history = await e.history("held")
    finally:
        await sender.close()
    assert [(x.kind, x.name, x.status) for x in history] == [
        ("step", "ready", "completed"),
        ("signal", "go", "completed"),
    ]


async def test_a_signal_from_another_process_landing_around_park(store_url: str) -> None:
    """Signals sent from another process just before, at and just after the moment the
    run parks (``hold_seconds`` after it blocked): each is received exactly once."""
    hold = 0.5
    offsets = [-0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05]
    sender = await Sender.start(store_url)
    try:
        async with durably.Engine(store_url, hold_seconds=hold, poll_interval=0.2) as e:
            handles = []
            for n, offset in enumerate(offsets):
                wid = f"around-{n}"
                STEP_DONE[wid] = asyncio.Event()
                handles.append(await e.start(wait_for_go, wid, workflow_id=wid))
                await asyncio.wait_for(STEP_DONE[wid].wait(), timeout=30)
                # timing the send, not waiting for a condition: the check below is positive
                await asyncio.sleep(max(0.0, hold + offset))
                await sender.send(wid, n)
            results = [await h.result(timeout=30) for h in handles]
            signals = [await e.signals(h.workflow_id) for h in handles]
    finally:
        await sender.close()
    assert results == list(range(len(offsets)))
    assert [len(s) for s in signals] == [1] * len(offsets)


async def test_a_wake_up_as_the_park_begins_does_not_park_the_workflow_without_its_wait(
    store_url: str,
) -> None:
    """The interleaving behind a workflow found stuck `sleeping`, its signal unread (about
    one run in six of the test above on PostgreSQL, whose NOTIFY pokes the run).

    A poke wakes the wait and, in the same loop iteration, the hold runs out: the woken
    branch ran first and left the run's waits, so the park found none, parked the
    workflow `sleeping` with no wake-up and no signal to watch, and the branch then met
    the park and was suspended. Nothing woke it again. Here the two events are ordered
    by hand on the live run; then a signal must still reach it.
    """
    STEP_DONE["raced"] = asyncio.Event()
    async with durably.Engine(store_url, hold_seconds=60.0, poll_interval=0.2) as e:
        handle = await e.start(wait_for_go, "raced", workflow_id="raced")
        await asyncio.wait_for(STEP_DONE["raced"].wait(), timeout=30)
        run = e._runs["raced"]
        deadline = time.monotonic() + 30
        while not run._blocks:  # the branch reaches its wait
            assert time.monotonic() < deadline, "the workflow never blocked on its signal"
            await asyncio.sleep(0.005)
        run.poke()  # a wake-up (a NOTIFY, a child, a timer) ...
        run._start_park()  # ... and the hold running out, in the same iteration
        await asyncio.wait_for(run.settle(), timeout=10)  # the park decided
        assert (await handle.info()).status != "sleeping", "parked with no wait to wake it"
        await e.send_signal("raced", "go", "late")
        assert await handle.result(timeout=20) == "late"


# --- the heartbeat keeps a healthy run's lease in the future ----------------------------

RUNS: list[str] = []


@durably.step
async def long_step(seconds: float) -> str:
    RUNS.append("long_step")
    await asyncio.sleep(seconds)
    return "done"


@durably.workflow
async def long_work(seconds: float) -> str:
    return await long_step(seconds)


async def test_the_heartbeat_keeps_the_lease_of_a_long_step_in_the_future(
    store_url: str,
) -> None:
    """A 1.5 s lease and a 4.5 s step: sampled from another connection all along, the row's
    lease expiry is always ahead of the clock, and the workflow is claimed once."""
    RUNS.clear()
    lease = 1.5  # renewed every 0.5 s: a second of slack for a loaded machine
    async with durably.Engine(store_url, lease_seconds=lease, poll_interval=0.1) as e:
        handle = await e.start(long_work, 3 * lease, workflow_id="long")
        samples: list[tuple[float, float | None, str]] = []
        with durably.Client(store_url) as client:
            deadline = time.time() + 60
            while True:
                info = client.get_workflow("long")
                now = time.time()  # read after the row: the check is on the safe side
                if info.status != "running":
                    break
                samples.append((now, info.lease_expires_at, info.owner or ""))
                assert now < deadline, "the workflow did not finish within 60 s"
                await asyncio.sleep(0.05)
        expired = [(t, exp) for t, exp, _ in samples if exp is None or exp <= t]
        assert len(samples) > 40, f"too few samples of the running workflow: {len(samples)}"
        assert samples[-1][0] - samples[0][0] > 2.5 * lease, "the samples do not span the step"
        assert not expired, f"the lease was expired at {len(expired)} of {len(samples)} samples"
        assert {owner for _, _, owner in samples} == {e.executor_id}
        assert await handle.result(timeout=30) == "done"
        claims = await e.claims("long")
    assert RUNS == ["long_step"]
    assert [(c.epoch, c.reason) for c in claims] == [(1, "start")]


# --- SQLite's synchronous pragma --------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [("", 2), ("?synchronous=full", 2), ("?synchronous=normal", 1)],
    ids=["default", "full", "normal"],
)
async def test_sqlite_synchronous_is_full_unless_asked(
    sqlite_url: str, query: str, expected: int
) -> None:
    """FULL (2) by default, so a committed step survives power loss; NORMAL (1) on request.

    The pragma belongs to a connection, not to the file: it is read on the very
    connection the store (and the engine, through its store) commits with.
    """
    store = create_store(sqlite_url + query)
    store.open()
    try:
        assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == expected  # type: ignore[attr-defined]
    finally:
        store.close()
    async with durably.Engine(sqlite_url + query) as e:
        conn = e._store.store.conn  # type: ignore[attr-defined]
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == expected
