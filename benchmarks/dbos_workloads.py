"""The same workloads on DBOS Transact, for the DBOS column of ``python -m benchmarks``.

DBOS keeps process-global state (one ``DBOS`` instance, a launched executor),
so each round runs here in a child process:

    python -m benchmarks.dbos_workloads SPEC_JSON  ->  one JSON object on stdout

SPEC_JSON names the system database URLs and the rows to measure; the answer
maps each row name to its figure (same units as the durably column). Rows DBOS
cannot be measured on here are left out and the table says so.

Replay: DBOS re-runs a workflow from its first line only when it recovers or
forks it, each recorded step then returning its recorded output. A workflow of
N steps runs once, then is forked from past its last step
(``DBOS.fork_workflow``): the fork re-runs it from the top with all N outputs
recorded, timed inside the workflow on that pass (the step bodies must not run
again: counted). Recovery: a child process (``recovery-child``) starts N
workflows that each record a step and hang in the next; once all hang it is
SIGKILLed, and this process's ``DBOS()`` and ``launch()`` on the same database
recover them: timed until all N are ``SUCCESS``. Each recovery row has a
database of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

PAYLOAD = {"ok": True, "n": 0, "text": "a small result"}
_spans: list[tuple[float, float]] = []
_seen: list[float] = []
_step_runs = [0]  # bodies of dbos_step run in this process (a replay runs none)
_blocked = [0]  # recovery child: workflows parked in the blocking step
_CHILD = os.environ.get("DURABLY_BENCH_CHILD") == "1"


class _Finished:
    """Counts recovered workflows reaching their last line (they run on DBOS's threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.target = 0
        self.all = threading.Event()

    def expect(self, n: int) -> None:
        with self.lock:
            self.count, self.target = 0, n
            self.all.clear()

    def one(self) -> None:
        with self.lock:
            self.count += 1
            if self.count >= self.target:
                self.all.set()


_finished = _Finished()


@DBOS.step()
async def dbos_step(i: int) -> dict[str, Any]:
    _step_runs[0] += 1
    return {**PAYLOAD, "n": i}


@DBOS.step()
async def dbos_block() -> None:
    """In the recovery child: hang here (the parent SIGKILLs it); elsewhere return at once."""
    if _CHILD:
        _blocked[0] += 1
        await asyncio.Event().wait()


@DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos ships no types for it
async def dbos_steps(steps: int) -> int:
    t0 = time.perf_counter()
    for i in range(steps):
        await dbos_step(i)
    _spans.append((t0, time.perf_counter()))
    return steps


@DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos ships no types for it
async def dbos_recover() -> int:
    """The shape of durably's ``bench-recover``: a step, the blocking step, a step."""
    await dbos_step(0)
    await dbos_block()
    await dbos_step(1)
    _finished.one()
    return 2


@DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos ships no types for it
async def dbos_signal() -> None:
    await DBOS.recv_async("go", timeout_seconds=60)
    _seen.append(time.perf_counter())


async def step_us(steps: int) -> float:
    _spans.clear()
    handle = await DBOS.start_workflow_async(dbos_steps, steps)
    await handle.get_result()
    ((t0, t1),) = _spans
    return (t1 - t0) / steps * 1e6


async def throughput(steps: int, in_flight: int, total: int) -> float:
    left = [total]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            handle = await DBOS.start_workflow_async(dbos_steps, steps)
            await handle.get_result()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return total / (time.perf_counter() - t0)


async def signal_us(n: int) -> float:
    """The median of ``n`` wake-ups, as durably's ``signal_us``."""
    took = []
    for _ in range(n):
        _seen.clear()
        handle = await DBOS.start_workflow_async(dbos_signal)
        await asyncio.sleep(0.2)  # DBOS exposes no "is waiting" status to wait on; see docs
        t0 = time.perf_counter()
        await DBOS.send_async(handle.workflow_id, "x", "go")
        await handle.get_result()
        took.append((_seen[-1] - t0) * 1e6)
    return statistics.median(took)


async def replay_us(steps: int) -> float:
    """Microseconds per recorded step when a finished workflow of ``steps`` steps re-runs.

    The fork starts past the last step (step ids are 1..steps), so every step's
    output is copied and the fork re-runs the workflow from its first line on the
    recorded outputs: the path DBOS recovery takes.
    """
    _spans.clear()
    handle = await DBOS.start_workflow_async(dbos_steps, steps)
    await handle.get_result()
    runs = _step_runs[0]
    fork = await DBOS.fork_workflow_async(handle.workflow_id, steps + 1)
    await fork.get_result()
    if len(_spans) != 2:
        raise RuntimeError(f"the fork of {handle.workflow_id} did not re-run it from the top")
    if _step_runs[0] != runs:
        raise RuntimeError(
            f"the fork ran {_step_runs[0] - runs} of {steps} recorded steps again: not a replay"
        )
    t0, t1 = _spans[-1]
    return (t1 - t0) / steps * 1e6


def _bytes(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        row = conn.execute(
            "SELECT sum(pgsize) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = 'operation_outputs')"
        ).fetchone()
        return int(row[0] or 0)
    finally:
        conn.close()


async def measure(rows: dict[str, list[Any]]) -> dict[str, float]:
    """Run each row's workload once: ``{row: [kind, *parameters]}`` -> ``{row: figure}``."""
    out: dict[str, float] = {}
    await step_us(10)  # warm-up
    for name, (kind, *params) in rows.items():
        if kind == "step":
            out[name] = await step_us(params[0])
        elif kind == "throughput":
            out[name] = await throughput(*params)
        elif kind == "signal":
            out[name] = await signal_us(params[0])
        elif kind == "replay":
            out[name] = await replay_us(params[0])
        elif kind == "bytes":
            path = params[1]
            before = _bytes(path)
            await step_us(params[0])
            out[name] = (_bytes(path) - before) / params[0]
    return out


# --- recovery of killed workflows: a child process that is SIGKILLed ------------------------


def recovery_seconds(url: str, n: int, timeout: float = 1200.0) -> float:
    """Seconds from ``DBOS()`` to ``n`` workflows left by a SIGKILLed process all done.

    ``url`` must be a system database no other run has used. The child starts
    ``n`` workflows (ids ``recover-0`` ...) that each record a step and hang in
    the next; once all hang it is SIGKILLed. DBOS is then made and launched here
    on the same database: its launch finds the pending workflows of this
    executor (``local``, as in the child) and application version (the same
    code) and re-runs them. Timed until the last has returned and none is still
    pending or enqueued.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.dbos_workloads", "recovery-child", url, str(n)],
        stdout=subprocess.PIPE,
        env={**os.environ, "DURABLY_BENCH_CHILD": "1"},
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the DBOS recovery child did not get ready: {line!r}")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    _finished.expect(n)
    deadline = time.monotonic() + timeout
    t0 = time.perf_counter()
    _launch(url)
    try:
        if not _finished.all.wait(timeout):
            raise TimeoutError(f"DBOS recovered {_finished.count} of {n} workflows in {timeout} s")
        # The last ones' SUCCESS rows are written just after they return.
        while DBOS.list_workflows(
            status=["PENDING", "ENQUEUED"], load_input=False, load_output=False, limit=1
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"DBOS workflows still pending after {timeout} s")
            time.sleep(0.001)
        elapsed = time.perf_counter() - t0
        done = DBOS.list_workflows(status="SUCCESS", load_input=False, load_output=False)
        if len(done) != n:
            raise RuntimeError(f"{len(done)} of {n} recovered DBOS workflows succeeded")
        return elapsed
    finally:
        DBOS.destroy(destroy_registry=False)


async def _recovery_child(n: int) -> None:
    for i in range(n):
        with SetWorkflowID(f"recover-{i}"):
            await DBOS.start_workflow_async(dbos_recover)
    deadline = time.monotonic() + 1200
    while _blocked[0] < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {_blocked[0]} of {n} workflows reached the blocking step")
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await asyncio.Event().wait()  # until SIGKILL


# --- one child process per round ------------------------------------------------------------


def _launch(url: str) -> None:
    config: DBOSConfig = {
        "name": "durably-bench",
        "system_database_url": url,
        "log_level": "WARNING",
        "run_admin_server": False,
    }
    DBOS(config=config)
    DBOS.launch()


def main(spec: dict[str, Any]) -> dict[str, float]:
    """For each system database in ``spec``: launch DBOS on it, measure its rows, destroy it.

    A recovery row has its database to itself: the launch is what it times.
    """
    result: dict[str, float] = {}
    for url, rows in spec["databases"]:
        recovery = [(name, p) for name, (kind, *p) in rows.items() if kind == "recovery"]
        if recovery:
            if len(rows) != 1:
                raise ValueError(f"a recovery row needs a database of its own: {url}")
            ((name, (n,)),) = recovery
            result[name] = recovery_seconds(url, n)
            continue
        _launch(url)
        try:
            result.update(asyncio.run(measure(rows)))
        finally:
            DBOS.destroy(destroy_registry=False)
    return result


if __name__ == "__main__" and sys.argv[1:2] == ["recovery-child"]:
    _launch(sys.argv[2])
    asyncio.run(_recovery_child(int(sys.argv[3])))
elif __name__ == "__main__":
    tempfile.tempdir = None
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
