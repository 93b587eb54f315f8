"""A cancel is final once accepted (issue 14): on SQLite and PostgreSQL.

A workflow that has not started never starts; one that finishes after the
cancel was committed ends ``cancelled`` with its result kept in the row's
``output``; a cancelled queued workflow stuck in plain code frees its place in
the queue at once. The kill-and-recover variants run real worker processes
(``durably worker tests.cancel_flows``) that are SIGKILLed, and count the
effects the steps wrote to a file.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.queues import Queue
from tests import cancel_flows, children

RAN: list[str] = []
GATES: dict[str, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    GATES.clear()


def engine(url: str, *queues: Queue, **kw: Any) -> durably.Engine:
    kw.setdefault("poll_interval", 0.2)
    kw.setdefault("hold_seconds", 0.05)
    return durably.Engine(url, queues=queues, **kw)


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 15.0) -> None:
    """Wait for ``check`` to hold; fail loudly, naming ``what``, after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.02)


@durably.step
async def note(text: str) -> str:
    RAN.append(text)
    return text


@durably.workflow(name="test_cancel_final.queued")
async def queued(label: str) -> str:
    RAN.append(f"body {label}")  # plain code: must not run for a workflow cancelled unstarted
    return await note(f"step {label}")


@durably.workflow(name="test_cancel_final.late")
async def late(label: str) -> int:
    await note(f"step {label}")
    await GATES[label].wait()  # plain code, no durable call: the cancel arrives here
    RAN.append(f"returning {label}")
    return 5


# --- a workflow that has not started never starts ------------------------------------------


async def test_a_queued_workflow_cancelled_before_it_starts_never_runs(store_url: str) -> None:
    q = Queue("tcf-unstarted", concurrency=1)
    async with engine(store_url) as bystander:  # does not serve the queue: "a" stays pending
        handle = await q.enqueue(bystander, queued, "a", workflow_id="a")
        assert (await handle.info()).status == "pending"
        assert await bystander.cancel("a") == ["a"]
        info = await handle.info()
        assert (info.status, info.cancel_requested) == ("cancelled", 1)
        error = json.loads(info.error or "null")
        assert (
            error["type"] == "durably.errors.Cancelled" and "before it started" in error["message"]
        )
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=1)
    async with engine(store_url, q) as server:
        # "b", enqueued after "a" on the same queue, runs: a pass that could have claimed
        # "a" (the older) has happened by then.
        b = await q.enqueue(server, queued, "b", workflow_id="b")
        assert await b.result(timeout=15) == "step b"
        assert (await server.get_workflow("a")).status == "cancelled"
        assert [c.reason for c in await server.claims("a")] == []
    assert RAN == ["body b", "step b"]


async def test_a_pending_workflow_started_by_a_client_and_cancelled_never_runs(
    store_url: str,
) -> None:
    with durably.Client(store_url) as client:
        client.start(queued, "c", workflow_id="c")
        assert client.cancel("c") == ["c"]
        assert client.get_workflow("c").status == "cancelled"
    async with engine(store_url) as e:
        d = await e.start(queued, "d", workflow_id="d")
        assert await d.result(timeout=15) == "step d"
        await e.recover()  # one more look for work, after "d" ran: "c" is not claimable
        assert await e.claims("c") == []
    assert RAN == ["body d", "step d"]


# --- a cancel after the last durable call --------------------------------------------------


async def test_a_cancel_after_the_last_durable_call_ends_cancelled_with_the_result_kept(
    store_url: str,
) -> None:
    GATES["l"] = asyncio.Event()
    async with engine(store_url) as e:
        handle = await e.start(late, "l", workflow_id="l")
        await until(lambda: _ran("step l"), "the step of 'l'")
        assert await e.cancel("l") == ["l"]
        GATES["l"].set()  # the code goes on to `return 5` with no durable call on the way
        with pytest.raises(durably.Cancelled, match="cancelled after its last durable call"):
            await handle.result(timeout=15)
        info = await handle.info()
        kinds = [x.kind for x in await e.history("l")]
    assert info.status == "cancelled"
    assert json.loads(info.output or "null") == 5  # the result, kept for inspection
    assert RAN == ["step l", "returning l"]
    assert kinds == ["step"]


async def test_a_cancel_committed_after_the_finish_changes_nothing(store_url: str) -> None:
    GATES["f"] = asyncio.Event()
    GATES["f"].set()
    async with engine(store_url) as e:
        handle = await e.start(late, "f", workflow_id="f")
        assert await handle.result(timeout=15) == 5
        assert await e.cancel("f") == []
        info = await handle.info()
    assert (info.status, info.cancel_requested, info.error) == ("completed", 0, None)


# --- a cancelled queued workflow frees its place at once -------------------------------------


async def test_a_cancelled_queued_workflow_stuck_in_plain_code_frees_its_place(
    store_url: str,
) -> None:
    GATES["s"] = asyncio.Event()
    q = Queue("tcf-stuck", concurrency=1)
    async with engine(store_url, q) as e:
        try:
            stuck = await q.enqueue(e, late, "s", workflow_id="s")
            await until(lambda: _ran("step s"), "the step of 's'")
            nxt = await q.enqueue(e, queued, "n", workflow_id="n")
            assert (await nxt.info()).status == "pending"  # the queue's one place is taken
            assert await e.cancel("s") == ["s"]
            assert await nxt.result(timeout=15) == "step n"
            # "n" ran while "s" is still stuck in its plain code, holding its lease
            assert "returning s" not in RAN
            assert (await stuck.info()).status == "running"
        finally:
            GATES["s"].set()
        with pytest.raises(durably.Cancelled):
            await stuck.result(timeout=15)
    assert RAN == ["step s", "body n", "step n", "returning s"]


# --- a child started after its parent's cancel was committed ------------------------------

URLS: dict[str, str] = {}


@durably.workflow(name="test_cancel_final.child")
async def child(label: str) -> str:
    RAN.append(f"child {label}")  # plain code: must not run, its parent was cancelled first
    return await note(f"child step {label}")


@durably.workflow(name="test_cancel_final.spawner")
async def spawner(label: str) -> str:
    await note(f"step {label}")
    # Plain code, the event loop held: a cancel committed from elsewhere lands here, after
    # this run's last cancel point and before the child's start is written.
    with durably.Client(URLS[label]) as client:
        client.cancel(label)
    await durably.start_child(child, label, workflow_id=f"{label}-child")
    return label  # it ends cancelled all the same: its cancel was committed


async def test_a_child_started_after_its_parent_s_cancel_was_committed_is_cancelled(
    store_url: str,
) -> None:
    """The cancel found no child to cascade to; the child's start, written after it, must
    not give the cancelled parent a child that runs on (it is cancelled unstarted)."""
    URLS["p"] = store_url
    async with engine(store_url) as e:
        parent = await e.start(spawner, "p", workflow_id="p")
        with pytest.raises(durably.Cancelled):
            await parent.result(timeout=15)
        kid = e.handle("p-child")
        with pytest.raises(durably.Cancelled):
            await kid.result(timeout=15)
        info = await kid.info()
    assert (info.status, info.cancel_requested) == ("cancelled", 1)
    assert RAN == ["step p"]


@durably.workflow(name="test_cancel_final.tidier")
async def tidier(label: str) -> str:
    try:
        await durably.sleep(60)
        return "woke"
    finally:  # the cancel was delivered: cleanup may start a child, which must run
        kid = await durably.start_child(child, label, workflow_id=f"{label}-cleanup")
        RAN.append(f"joined {await kid.result()}")


async def test_a_child_started_by_cleanup_after_the_cancel_was_delivered_runs(
    store_url: str,
) -> None:
    """Once a run has received its cancel, its ``finally`` blocks run as usual: a child they
    start is the cleanup's, not one the cancel's cascade missed, and is not cancelled."""
    async with engine(store_url) as e:
        parent = await e.start(tidier, "t", workflow_id="t")
        await until(lambda: _status(e, "t", "sleeping"), "'t' to park")
        await e.cancel("t")
        with pytest.raises(durably.Cancelled):
            await parent.result(timeout=15)
        info = await e.handle("t-cleanup").info()
    assert info.status == "completed"
    assert RAN == ["child t", "child step t", "joined child step t"]


@durably.workflow(name="test_cancel_final.napper")
async def napper(label: str) -> str:
    try:
        await durably.sleep(60)
        return await note(f"woke {label}")
    finally:
        await note(f"cleanup {label}")  # runs as a step once the cancel is delivered


@pytest.mark.parametrize("partition", [False, True])
async def test_a_cancel_reaches_a_parked_queued_workflow_while_its_queue_is_full(
    store_url: str, partition: bool
) -> None:
    """A parked workflow of a full queue (or partition), asked to stop, is run to deliver
    its cancel at once: asked to stop it holds no place, so it waits for none to free."""
    GATES["busy"] = asyncio.Event()
    q = Queue(f"tcf-parked-{partition}", concurrency=1, partition=partition)
    key = {"partition_key": "k"} if partition else {}
    async with engine(store_url, q) as e:
        try:
            sleeper = await q.enqueue(e, napper, "z", workflow_id="z", **key)
            await until(lambda: _status(e, "z", "sleeping"), "'z' to park")
            await q.enqueue(e, late, "busy", workflow_id="busy", **key)
            await until(lambda: _ran("step busy"), "the step of 'busy'")  # the one place
            assert await e.cancel("z") == ["z"]
            with pytest.raises(durably.Cancelled):
                await sleeper.result(timeout=5)
            assert "returning busy" not in RAN  # the place was still taken meanwhile
        finally:
            GATES["busy"].set()
    assert RAN[:3] == ["step busy", "cleanup z", "returning busy"]


async def _status(e: durably.Engine, workflow_id: str, status: str) -> bool:
    return (await e.handle(workflow_id).status()) == status


async def _ran(text: str) -> bool:
    return text in RAN


# --- kill and recover: the cancel survives the process -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("then", ["return", "step"])
def test_a_cancel_accepted_before_a_sigkill_holds_after_recovery(
    store_url: str, tmp_path: Path, then: str
) -> None:
    """The cancel is committed while the run is in plain code; the process dies; the
    recovery replays it to the end: it ends cancelled, and no step runs again or anew
    (``then``: the code goes on to ``return 5``, or to one more step first)."""
    flow = cancel_flows.late_return if then == "return" else cancel_flows.two_steps
    kit = Workers(store_url, tmp_path)
    try:
        first = kit.spawn()
        with durably.Client(store_url) as client:
            client.start(flow, "k", workflow_id="k")
            kit.wait_for(lambda: committed(client, "k"), "the first step's receipt", first)
            assert client.cancel("k") == ["k"]
            assert client.get_workflow("k").status == "running"  # stuck in plain code
            kit.kill(first)
            kit.release("k")  # the plain code would now go on to `return 5`
            second = kit.spawn()
            kit.wait_for(lambda: client.get_workflow("k").finished, "'k' to finish", second)
            info = client.get_workflow("k")
            claims = client.claims("k")
        assert info.status == "cancelled"
        # the result, kept for inspection; none when the cancel was raised at the step
        assert json.loads(info.output or "null") == (5 if then == "return" else None)
        assert kit.effects() == ["k:before"]  # the step did not run again; "after" never
        assert [c.reason for c in claims] == ["start", "recovery"]
    finally:
        kit.stop()


# --- a cancel asked by another process --------------------------------------------------


def test_a_cancel_from_another_process_reaches_a_run_waiting_beside_a_long_step(
    store_url: str, tmp_path: Path
) -> None:
    """`durably cancel` in a shell reaches a run that a worker holds in memory: its wait
    raced against a minute-long step receives Cancelled within the worker's poll interval
    (0.2 s here), the step is cut short and the ``finally`` step runs, as when the
    worker's own engine is asked. SQLite has no notification from another process: the
    worker finds the cancel in its recovery pass; PostgreSQL tells it by NOTIFY."""
    kit = Workers(store_url, tmp_path)
    try:
        worker = kit.spawn()
        with durably.Client(store_url) as client:
            client.start(cancel_flows.stoppable, "s", workflow_id="s")
            kit.wait_for(lambda: kit.effects() == ["s:called"], "the long step", worker)
            asked = subprocess.run(
                children.durably_cli(store_url, "cancel", "s"),
                cwd=children.REPO,
                env=children.child_env(),
                capture_output=True,
                check=True,
            )
            cancelled_at = time.monotonic()
            kit.wait_for(lambda: client.get_workflow("s").finished, "'s' to finish", worker)
            waited = time.monotonic() - cancelled_at
            info = client.get_workflow("s")
            journal = [(e.kind, e.name) for e in client.history("s")]
        assert b"s" in asked.stdout
        assert info.status == "cancelled"
        assert waited < 5.0, f"the cancel took {waited:.1f} s to end the workflow"
        assert kit.effects() == ["s:called", "s:cleanup"]
        assert ("cancel", "signal 'stop'") in journal  # delivered to the wait, not the step
    finally:
        kit.stop()


def test_a_cancel_sent_while_the_listener_is_away_still_reaches_the_run(
    postgres_url: str, pg_cluster: Any, tmp_path: Path
) -> None:
    """On PostgreSQL a cancel's NOTIFY is lost while the worker's LISTEN connection is
    away (the server restarted it, a network cut). The worker's recovery pass finds the
    cancel all the same, as on SQLite: the NOTIFY is a shortcut, not the only way."""
    dbname = postgres_url.rsplit("/", 1)[1].split("?")[0]
    kit = Workers(postgres_url, tmp_path)
    try:
        worker = kit.spawn()
        with durably.Client(postgres_url) as client:
            client.start(cancel_flows.stoppable, "s", workflow_id="s")
            kit.wait_for(lambda: kit.effects() == ["s:called"], "the long step", worker)
            try:  # no new connection, so the listener cannot come back; then cut it
                pg_cluster.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
                pg_cluster.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    f"datname = '{dbname}' AND query LIKE 'LISTEN%'"
                )
                time.sleep(0.3)
                client.cancel("s")
                cancelled_at = time.monotonic()
                kit.wait_for(lambda: client.get_workflow("s").finished, "'s' to end", worker)
                waited = time.monotonic() - cancelled_at
            finally:
                pg_cluster.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            info = client.get_workflow("s")
        assert info.status == "cancelled"
        assert waited < 5.0, f"the cancel took {waited:.1f} s to end the workflow"
        assert kit.effects() == ["s:called", "s:cleanup"]
    finally:
        kit.stop()


def committed(client: durably.Client, workflow_id: str) -> bool:
    """True once the workflow's first step has its receipt in the journal (its effect
    alone is not enough: a process killed before the commit runs the step again)."""
    return [(e.kind, e.status) for e in client.history(workflow_id)] == [("step", "completed")]


class Workers:
    """``durably worker tests.cancel_flows`` processes on one database, and their effects."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, *extra: str) -> subprocess.Popen[bytes]:
        env = children.child_env(
            {cancel_flows.EFFECTS: str(self.tmp / "effects"), cancel_flows.FLAGS: str(self.tmp)}
        )
        argv = children.durably_cli(
            self.url, "worker", "tests.cancel_flows", "--poll", "0.2", "--lease", "2", *extra
        )
        log = open(self.tmp / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(argv, cwd=children.REPO, env=env, stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        return proc

    def effects(self) -> list[str]:
        path = self.tmp / "effects"
        return path.read_text().splitlines() if path.exists() else []

    def release(self, workflow_id: str) -> None:
        (self.tmp / f"go-{workflow_id}").touch()

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        proc.wait(10)

    def wait_for(self, check: Callable[[], bool], what: str, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 30
        while not check():
            if proc.poll() is not None or time.monotonic() > deadline:
                logs = "\n".join(p.read_text() for p in sorted(self.tmp.glob("worker-*.log")))
                raise AssertionError(
                    f"timed out waiting for {what} (worker exit {proc.poll()}); "
                    f"effects {json.dumps(self.effects())}\n{logs}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
