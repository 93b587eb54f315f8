"""Retention: ``durably prune`` and ``Engine(retention=...)`` remove finished workflows only.

Pruning runs against a real worker process on each backend; SQLite gives the space back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import errors
from tests import children
from tests import ops_flows as flows
from tests.test_archive import run_cli

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def worker(url: str, tmp_path: Path, effects: Path, step_seconds: float = 0.0) -> Iterator[None]:
    """A real ``durably worker tests.ops_flows`` process, stopped with SIGTERM at the end."""
    env = children.child_env({flows.EFFECTS: str(effects), "OPS_STEP_SECONDS": str(step_seconds)})
    argv = [sys.executable, "-m", "durably.cli", "--database", url, "worker", "tests.ops_flows",
            "--lease", "2", "--poll", "0.1"]  # fmt: skip
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text(errors="replace")


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def statuses(url: str) -> dict[str, str]:
    with durably.Client(url) as client:
        return {w.workflow_id: w.status for w in client.list_workflows(limit=10_000)}


def prune_all(url: str) -> None:
    result = run_cli(url, "prune", "--finished-before", "2999-01-01")
    assert result.exit_code == 0, result.output


def test_prune_keeps_every_unfinished_workflow_while_a_worker_runs(
    store_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    runs = [f"s{i}" for i in range(24)]
    waiters = [f"w{i}" for i in range(6)]
    parents = [f"p{i}" for i in range(4)]
    with durably.Client(store_url) as client:
        for wid in runs:
            client.start(flows.steps, wid, 4, workflow_id=wid)
        for wid in waiters:
            client.start(flows.waiter, wid, workflow_id=wid)
        for wid in parents:
            client.start(flows.parent, wid, workflow_id=wid)
    with worker(store_url, tmp_path, effects, step_seconds=0.01):

        def settled() -> bool:
            prune_all(store_url)  # with everything finished so far eligible, again and again
            now = statuses(store_url)
            # Done when every run has finished and been pruned while the worker runs.
            return all(now.get(w) == "waiting" for w in waiters + parents) and not any(
                w in now for w in runs
            )

        wait_for(settled, "the runs to finish and the waits to park")
        # A finished child whose parent waits is kept: the parent still joins it by its row.
        assert {f"{p}-child" for p in parents} <= set(statuses(store_url))
        with durably.Client(store_url) as client:
            for wid in waiters + parents:
                client.send_signal(wid, "go", wid)  # WorkflowNotFound had one been pruned
        wait_for(lambda: (prune_all(store_url), not statuses(store_url))[1], "all to finish")
    done = collections.Counter(flows.effects(str(effects)))
    expected = [f"{w}:{k}" for w in runs for k in range(1, 5)]
    expected += [f"{w}:{k}" for w in waiters for k in (1, 2)]
    expected += [f"{p}:1" for p in parents]  # the children's step
    assert done == collections.Counter(expected)  # every step once: no journal lost mid-run


async def test_engine_retention_prunes_what_finished_and_keeps_what_waits(store_url: str) -> None:
    keep = datetime.timedelta(seconds=0.3)
    async with durably.Engine(store_url, poll_interval=0.1, retention=keep) as e:
        assert await (await e.start(flows.steps, "d", 1, workflow_id="d")).result(5) == 1
        await e.start(flows.waiter, "w", workflow_id="w")
        deadline = time.monotonic() + 20
        while True:
            try:
                await e.get_workflow("d")
            except errors.WorkflowNotFound:
                break
            assert time.monotonic() < deadline, "the finished workflow was never pruned"
            await asyncio.sleep(0.05)
        assert not (await e.get_workflow("w")).finished  # running or waiting: kept
        await e.send_signal("w", "go", 1)
        assert await e.handle("w").result(timeout=10) == [1, 1, 2]


def test_prune_by_status_and_date(store_url: str) -> None:
    with durably.Client(store_url) as client:
        client.start(flows.waiter, "a", workflow_id="a")
    durably.run(flows.steps, "b", 1, workflow_id="b", database=store_url)
    result = run_cli(store_url, "prune", "--finished-before", "2999-01-01", "--status", "failed")
    assert result.exit_code == 0 and "pruned 0" in result.output
    assert "pruned 0" in run_cli(store_url, "prune", "--finished-before", "1d").output
    result = run_cli(store_url, "prune", "--finished-before", "2999-01-01")
    assert "pruned 1" in result.output
    assert set(statuses(store_url)) == {"a"}  # unfinished (waits for a signal): kept
    bad = run_cli(store_url, "prune", "--finished-before", "last tuesday")
    assert bad.exit_code == 2 and "is not a date" in bad.output


def test_sqlite_gives_the_space_of_pruned_workflows_back(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    url = f"sqlite:///{path}"
    big = "x" * 20_000

    async def fill() -> None:
        async with durably.Engine(url, poll_interval=0.1) as e:
            handles = [await e.start(flows.steps, big, 2, workflow_id=f"b{i}") for i in range(150)]
            for h in handles:
                await h.result(timeout=60)

    asyncio.run(fill())
    with contextlib.closing(sqlite3.connect(path)) as counting:
        pages = counting.execute("PRAGMA page_count").fetchone()[0]
    prune_all(url)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    after, free = (
        conn.execute("PRAGMA page_count").fetchone()[0],
        conn.execute("PRAGMA freelist_count").fetchone()[0],
    )
    conn.close()
    assert after < pages / 4, (pages, after, free)
    assert free < 64


def test_a_batch_of_300_is_pruned_in_a_few_statements_with_every_row_naming_them(
    store_url: str,
) -> None:
    """Pruning deletes a statement per table and 256 workflows, not six a workflow: 300
    finished workflows (two run for real, with journal, claims and events rows) go with
    every row naming them; the one waiting for a signal stays, with its rows."""
    from durably.storage import base, create_store

    with durably.Client(store_url) as client:
        client.start(flows.waiter, "w", workflow_id="w")
    for wid in ("r-1", "r-2"):
        durably.run(flows.steps, wid, 2, workflow_id=wid, database=store_url)
    with durably.Client(store_url) as client:
        wait_for(lambda: statuses(store_url)["w"] == "waiting", "w to wait", 60)
    store = create_store(store_url)
    store.open()
    try:
        fill = (
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
            "VALUES (:workflow_id, 'n', 'completed', '[]', 1.0, 1.0)"
        )
        store._begin(True)  # type: ignore[attr-defined]
        for i in range(298):
            store._execute(store._paramstyle(fill), {"workflow_id": f"old-{i:03d}"})  # type: ignore[attr-defined]
        store._commit()  # type: ignore[attr-defined]
        sent: list[str] = []
        execute = store._execute  # type: ignore[attr-defined]
        store._execute = lambda sql, p=None: sent.append(sql) or execute(sql, p)  # type: ignore[attr-defined]
        op = base.Op(store.prune, (time.time() + 60, None, 400), True)
        store.run_batch([op])
        del store._execute  # type: ignore[attr-defined]
        assert op.error is None, op.error
        assert len(op.result) == 300 and {"r-1", "r-2", "old-000"} <= set(op.result)
        deletes = [sql for sql in sent if "DELETE FROM" in sql]
        assert len(deletes) == 12, deletes  # 6 tables, 256 + 44 ids each
        left = {
            table: {str(r[0]) for r in execute(f"SELECT DISTINCT workflow_id FROM {table}")}
            for table in ("workflows", "journal", "claims", "events")
        }
    finally:
        store.close()
    assert left == {"workflows": {"w"}, "journal": {"w"}, "claims": {"w"}, "events": {"w"}}


def test_a_child_is_kept_while_its_parent_is_and_goes_in_the_pass_after(store_url: str) -> None:
    """A finished child old enough to prune stays while its parent is kept (a failed
    parent resumed later joins it by its row), and goes in the pass after the parent's."""
    from durably.storage import base, create_store

    store: Any = create_store(store_url)
    store.open()
    row = (
        "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at, "
        "parent_id) VALUES (:workflow_id, 'n', :status, '[]', 1.0, :updated_at, :parent_id)"
    )

    def prune(before: float) -> list[str]:
        op = base.Op(store.prune, (before, None, 200), True)
        store.run_batch([op])
        assert op.error is None, op.error
        return sorted(op.result)

    try:
        store._begin(True)
        for wid, status, updated_at, parent in (
            ("parent", "failed", 500.0, None),  # failed lately: resumable, kept
            ("child", "completed", 2.0, "parent"),  # finished long ago
            ("orphan", "completed", 2.0, "gone"),  # its parent already pruned
        ):
            store._execute(
                store._paramstyle(row),
                {
                    "workflow_id": wid,
                    "status": status,
                    "updated_at": updated_at,
                    "parent_id": parent,
                },
            )
        store._commit()
        assert prune(100.0) == ["orphan"]  # the child waits for its parent
        assert prune(1000.0) == ["parent"]  # the parent's pass: the child still there
        assert prune(1000.0) == ["child"]  # the pass after
    finally:
        store.close()


async def _child_parked(e: durably.Engine, workflow_id: str) -> None:
    deadline = time.monotonic() + 20
    while (await e.get_workflow(workflow_id)).status != "waiting":
        assert time.monotonic() < deadline, f"{workflow_id} never parked"
        await asyncio.sleep(0.05)


async def _gone(e: durably.Engine, workflow_id: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            await e.get_workflow(workflow_id)
        except errors.WorkflowNotFound:
            return
        assert time.monotonic() < deadline, f"{workflow_id} was never pruned"
        await asyncio.sleep(0.05)


def test_prune_keeps_a_parent_while_a_child_it_started_is_unfinished(store_url: str) -> None:
    """A parent that finished without joining its child used to be pruned while the child
    ran on: the child then named a parent that no longer existed, and its end woke it. The
    parent now stays until its children have finished, then goes; the child the pass after."""

    async def start() -> None:
        async with durably.Engine(store_url, poll_interval=0.1) as e:
            parent = await e.start(flows.detached, "p", workflow_id="p")
            assert await parent.result(timeout=20) == "p-child"
            await _child_parked(e, "p-child")

    asyncio.run(start())
    prune_all(store_url)
    assert statuses(store_url) == {"p": "completed", "p-child": "waiting"}

    async def finish() -> None:
        async with durably.Engine(store_url, poll_interval=0.1) as e:
            assert (await e.get_workflow("p-child")).parent_id == "p"
            await e.send_signal("p-child", "go", 1)
            assert await e.handle("p-child").result(timeout=20) == [1, 1, 2]

    asyncio.run(finish())
    prune_all(store_url)
    assert statuses(store_url) == {"p-child": "completed"}  # the parent's pass
    prune_all(store_url)
    assert statuses(store_url) == {}


async def test_retention_keeps_a_parent_until_the_children_it_started_finish(
    store_url: str,
) -> None:
    keep = datetime.timedelta(seconds=0.3)  # a pass every 50 ms
    async with durably.Engine(store_url, poll_interval=0.1, retention=keep) as e:
        assert await (await e.start(flows.detached, "q", workflow_id="q")).result(20) == "q-child"
        await _child_parked(e, "q-child")
        await asyncio.sleep(1.5)  # many passes, the parent long past the retention
        assert (await e.get_workflow("q")).status == "completed"
        await e.send_signal("q-child", "go", 1)
        assert await e.handle("q-child").result(timeout=20) == [1, 1, 2]
        await _gone(e, "q")
        await _gone(e, "q-child")
