"""Many worker processes on one PostgreSQL database: leases, fencing, recovery, wake-ups.

Real ``durably worker`` processes (tests/multiworker.py), a real PostgreSQL
cluster, real SIGKILL / SIGSTOP, and the fake payments service counting every
keyed effect. Each test reads what happened from the database, the effects
file the steps append to before acting, and the payments log. (The first test,
a lost lease noticed by the heartbeat, runs in one process on both backends.)
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.storage import base, create_store
from durably.testing.payments import FakePaymentsServer
from tests import multiworker
from tests import multiworker_flows as flows

pytestmark = pytest.mark.slow


def journal_is_clean(client: durably.Client, wid: str, steps: int) -> None:
    """Every seq once, in order, completed; epochs changed one at a time."""
    history = client.history(wid)
    assert [e.seq for e in history] == list(range(1, steps + 1)), (wid, history)
    assert all(e.kind == "step" and e.status == "completed" for e in history), (wid, history)
    claims = client.claims(wid)
    assert [c.epoch for c in claims] == list(range(1, len(claims) + 1)), (wid, claims)


def one_effect_per_key(server: FakePaymentsServer, keys: set[str]) -> None:
    made = collections.Counter(str(r["idempotency_key"]) for r in server.refunds())
    assert set(made) == keys
    assert all(count == 1 for count in made.values()), made.most_common(3)


# --- a lost lease, noticed by the heartbeat ---------------------------------------------------

HANG: dict[str, Any] = {}


@durably.step
async def hang() -> None:
    HANG["started"].set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        HANG["cancelled"] = time.monotonic()
        raise


@durably.workflow(name="test_multiworker.hangs")
async def hangs() -> None:
    await hang()


async def test_a_heartbeat_notices_a_lost_lease_and_stops_the_run(store_url: str) -> None:
    """The workflow is taken while its step runs: the step is stopped, not left to finish."""
    HANG.clear()
    HANG["started"] = asyncio.Event()
    async with durably.Engine(store_url, lease_seconds=0.6) as engine:
        await engine.start(hangs, workflow_id="h")
        await asyncio.wait_for(HANG["started"].wait(), 10)
        thief = create_store(store_url)
        thief.open()
        try:
            now = time.time()
            ops = [
                base.Op(thief.remove_executor, (engine.executor_id, True), True),
                base.Op(thief.claim_next, ("thief", [(hangs.definition.name, None)],
                                           now + 60, now, 10), True),
            ]  # fmt: skip
            thief.run_batch(ops)
            assert [w.workflow_id for w in ops[1].result] == ["h"]
            taken = time.monotonic()
        finally:
            thief.close()
        while "cancelled" not in HANG:
            assert time.monotonic() - taken < 5, "the run went on"
            await asyncio.sleep(0.02)
        stopped_after = HANG["cancelled"] - taken
        info = await engine.get_workflow("h")
        assert (info.owner, info.epoch, info.status) == ("thief", 2, "running")
        assert await engine.history("h") == []
    assert stopped_after < 3.0  # a heartbeat or two (every 0.2 s), not the step's 60 s
    assert [e.executor_id for e in await asyncio.to_thread(executors, store_url)] == []


def executors(url: str) -> list[durably.ExecutorInfo]:
    with durably.Client(url) as client:
        return client.executors()


# --- SIGKILL: 4 workers, 300 workflows ---------------------------------------------------------


def test_four_workers_finish_300_workflows_through_random_sigkills(
    postgres_url: str, tmp_path: Path
) -> None:
    rng = random.Random(20240605)
    count, kills_wanted = 300, 10
    ids = [f"wf-{n:03d}" for n in range(count)]
    server = FakePaymentsServer(tmp_path / "payments.jsonl").start()
    try:
        with multiworker.pool(
            postgres_url, tmp_path, server.url, lease=2.0, poll=0.5,
            env={flows.STEP_SECONDS: "0.05"},
        ) as workers:  # fmt: skip
            workers.start(4)
            started = time.monotonic()
            with durably.Client(postgres_url) as client:
                for n, wid in enumerate(ids):
                    client.start(flows.five_steps, n, workflow_id=wid)
            kills = 0
            while not multiworker.all_done(postgres_url, ids):
                assert time.monotonic() - started < 80, (
                    f"not done after 80 s: {multiworker.statuses(postgres_url, ids)}\n"
                    + workers.describe()
                )
                if kills < kills_wanted:
                    time.sleep(rng.uniform(0.3, 1.2))
                    victim = rng.choice([w for w in workers.workers if w.alive()])
                    workers.kill(victim)
                    workers.spawn()
                    kills += 1
                else:
                    time.sleep(0.2)
            elapsed = time.monotonic() - started
        effects = workers.effects_lines()
        with durably.Client(postgres_url) as client:
            for n, wid in enumerate(ids):
                info = client.get_workflow(wid)
                assert (info.status, info.output) == (
                    "completed", str(flows.five_steps_expected(n))
                ), info  # fmt: skip
                journal_is_clean(client, wid, 5)
            recoveries = sum(1 for wid in ids for c in client.claims(wid) if c.reason == "recovery")
        one_effect_per_key(server, {f"{wid}:{seq}" for wid in ids for seq in range(1, 6)})
    finally:
        server.stop()

    # No step ever started again once its successor had started.
    starts: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    keys: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for e in effects:
        starts[(e["wf"], e["seq"])].append(e["t"])
        keys[(e["wf"], e["seq"])].add(e["key"])
    for wid in ids:
        for seq in range(1, 5):
            assert max(starts[(wid, seq)]) < min(starts[(wid, seq + 1)]), (wid, seq)
    assert all(len(k) == 1 for k in keys.values())  # a re-run kept its key
    again = sum(1 for t in starts.values() if len(t) > 1)
    print(
        f"\n300 workflows x 5 steps, 4 workers, {kills} SIGKILLs: done in {elapsed:.1f}s; "
        f"{recoveries} recoveries, {again} steps ran again (same key, one effect each)"
    )
    assert recoveries > 0 and again > 0  # the kills did land in the middle of work


# --- SIGSTOP: a zombie's late writes are fenced -----------------------------------------------


def test_a_stopped_worker_is_replaced_and_its_late_commit_is_fenced(
    postgres_url: str, tmp_path: Path
) -> None:
    with FakePaymentsServer(tmp_path / "payments.jsonl") as server, multiworker.pool(
        postgres_url, tmp_path, server.url, lease=2.0, poll=0.3
    ) as workers:  # fmt: skip
        (zombie,) = workers.start(1)
        with durably.Client(postgres_url) as client:
            client.start(flows.zombie, 1.0, workflow_id="z")

            def stuck_by(pid: int) -> bool:
                return any(
                    e["step"] == "stuck-start" and e["pid"] == pid for e in workers.effects_lines()
                )

            workers.wait_for(lambda: stuck_by(zombie.pid), "the zombie to start the stuck step")
            time.sleep(0.2)  # mid-step: its store thread is idle, its loop blocked
            workers.kill(zombie, signal.SIGSTOP)
            stopped_at = time.time()
            (heir,) = [workers.spawn()]
            workers.wait_for(lambda: client.get_workflow("z").finished, "the heir to finish")
            took_over = time.time() - stopped_at
            before = client.history("z")
            assert client.get_workflow("z").output is not None

            workers.kill(zombie, signal.SIGCONT)
            # The fence's own words: the late commit reached the database and was refused.
            fenced = "status completed); this executor held epoch 1 and must stop"
            workers.wait_for(lambda: fenced in zombie.output(), "the zombie to be fenced")
            time.sleep(0.5)
            assert zombie.alive()  # fenced, not crashed: it goes on serving
            info = client.get_workflow("z")
            after = client.history("z")
            claims = client.claims("z")
        effects = workers.effects_lines()
        one_effect_per_key(server, {"z:1", "z:2", "z:3"})

    assert (info.status, info.epoch) == ("completed", 2)
    assert after == before  # the late commit changed nothing
    assert [(c.epoch, c.previous_owner is None, c.reason) for c in claims] == [
        (1, True, "start"),
        (2, False, "recovery"),
    ]
    by_pid = collections.defaultdict(list)
    for e in effects:
        by_pid[e["pid"]].append(e["step"])
    assert by_pid[zombie.pid] == ["first", "stuck-start", "stuck-end"]  # woke, finished, fenced
    assert by_pid[heir.pid] == ["stuck-start", "stuck-end", "last"]
    assert took_over >= 1.0  # the heir waited for the lease: the zombie's pid was alive


# --- PostgreSQL restarts under running workers ---------------------------------------------------


def test_workers_ride_out_a_postgres_restart(
    pg_cluster: Any, postgres_url: str, tmp_path: Path
) -> None:
    count = 40
    ids = [f"r-{n:02d}" for n in range(count)]
    with FakePaymentsServer(tmp_path / "payments.jsonl") as server, multiworker.pool(
        postgres_url, tmp_path, server.url, lease=5.0, poll=0.5,
        env={flows.STEP_SECONDS: "0.3"},
    ) as workers:  # fmt: skip
        workers.start(2)
        with durably.Client(postgres_url) as client:
            for n, wid in enumerate(ids):
                client.start(flows.five_steps, n, workflow_id=wid)
        workers.wait_for(lambda: len(workers.effects_lines()) >= count, "the first steps")
        pg_cluster.restart()
        restarted = time.monotonic()
        workers.wait_for(lambda: multiworker.all_done(postgres_url, ids), "all done", 60)
        print(f"\nall {count} workflows done {time.monotonic() - restarted:.1f}s after restart")
        assert all(w.alive() for w in workers.workers), workers.describe()
        logs = "\n".join(w.output() for w in workers.workers)
        with durably.Client(postgres_url) as client:
            for n, wid in enumerate(ids):
                info = client.get_workflow(wid)
                assert info.output == str(flows.five_steps_expected(n)), (info, info.error)
                journal_is_clean(client, wid, 5)
        one_effect_per_key(server, {f"{wid}:{seq}" for wid in ids for seq in range(1, 6)})
    assert "lost the connection" in logs or "lost the wake-up connection" in logs


# --- a signal from one process wakes a workflow waiting in another -------------------------------


def test_a_signal_wakes_a_workflow_waiting_in_another_process(
    postgres_url: str, tmp_path: Path
) -> None:
    """Timed by the wall clock of one host: send, then the step after the wait starts.

    The worker polls every 60 s, so only the notification can wake it in time.
    """
    latencies: dict[str, list[float]] = {"parked": [], "held in memory": []}
    with FakePaymentsServer(tmp_path / "payments.jsonl") as server, multiworker.pool(
        postgres_url, tmp_path, server.url, lease=5.0, poll=60.0
    ) as workers:  # fmt: skip
        workers.start(1)
        with durably.Client(postgres_url) as client:
            for round_ in range(10):
                state = "parked" if round_ % 2 else "held in memory"
                latencies[state].append(signal_latency(client, workers, f"w{round_}", state))
    for state, values in latencies.items():
        print(
            f"\nsignal -> workflow woken in another process ({state}): "
            f"median {statistics.median(values) * 1000:.1f} ms, "
            f"max {max(values) * 1000:.1f} ms over {len(values)}"
        )
        assert max(values) < 5.0  # far below the 60 s poll: the notification woke it


def signal_latency(
    client: durably.Client, workers: multiworker.Pool, wid: str, state: str
) -> float:
    """Seconds from sending the signal to the start of the step after the wait."""
    client.start(flows.wait_for_go, workflow_id=wid)
    if state == "parked":
        workers.wait_for(lambda: client.get_workflow(wid).status == "waiting", "it to park")
    else:  # within the engine's hold_seconds (1 s) after the wait began
        workers.wait_for(
            lambda: any(e.kind == "signal" for e in client.history(wid)), "the wait to begin"
        )
    sent = time.time()
    client.send_signal(wid, "go", wid)

    def woke() -> list[dict[str, Any]]:
        return [e for e in workers.effects_lines() if e["wf"] == wid]

    workers.wait_for(lambda: bool(woke()), "the signal to wake it", timeout=10)
    workers.wait_for(lambda: client.get_workflow(wid).finished, "it to finish")
    assert client.get_workflow(wid).output is not None
    return float(woke()[0]["t"]) - sent


# --- the command line ---------------------------------------------------------------------------


def test_workers_lists_the_running_workers_and_worker_checks_its_queues(
    postgres_url: str, tmp_path: Path
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durably.cli", "--database", postgres_url, *args],
            cwd=multiworker.REPO,
            env=multiworker.Pool(postgres_url, tmp_path, "http://unused").env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert "no workers" in cli("workers").stdout
    with multiworker.pool(postgres_url, tmp_path, "http://unused", queues=["mw-llm"]) as workers:
        started = workers.start(2)
        listed = cli("workers")
        assert listed.returncode == 0, listed.stderr
        for worker in started:
            assert f"pid {worker.pid}," in listed.stdout, listed.stdout
        assert "queues: mw-llm)" in started[0].output()
    wrong = cli("worker", "tests.multiworker_flows", "--queue", "nope")
    assert wrong.returncode == 1
    assert "no durably.Queue named 'nope'" in wrong.stdout + wrong.stderr
    assert "mw-llm" in wrong.stdout + wrong.stderr  # it names the ones there are
