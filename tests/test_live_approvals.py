"""The pending approvals of every live workflow (``list_approvals()``, the dashboard's
approvals page and every open page's look, each half second) are one read: the
``approvals:pending`` event of each waiting and running workflow that published one,
where it was two reads for every live workflow (370 ms on SQLite, 1.45 s on
PostgreSQL with 2,000 live)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durably
from durably import codec, operations
from durably.agents import decisions
from durably.agents.approvals import INDEX_EVENT
from durably.storage import create_store

GATE: dict[str, asyncio.Event] = {}


def record(wid: str, n: int, status: str = "pending") -> dict[str, Any]:
    """One entry of an ``approvals:pending`` event, as the approval gate publishes it."""
    return {
        "workflow_id": wid,
        "approval_id": f"{wid}-call-{n}",
        "tool": "refund",
        "arguments": {"order": f"A{n}", "cents": 100 * n},
        "args_sha256": f"sha-{wid}-{n}",
        "tool_call_id": f"call-{n}",
        "requested_at": "2026-12-03T12:00:00+00:00",
        "deadline": None,
        "status": status,
    }


@durably.step(at_most_once=True)  # its intent commits the event set before it
async def held() -> str:
    await GATE["running"].wait()
    return "let go"


@durably.workflow
async def asking(records: list[dict[str, Any]], then: str) -> str:
    """Publishes its approvals, then waits (``waiting``), holds a step (``running``) or
    ends (``completed``: its approvals left published, no longer pending)."""
    if records:
        durably.set_event(INDEX_EVENT, records)
    if then == "wait":
        return str(await durably.wait_for_signal("go"))
    if then == "run":
        return await held()
    return "done"


async def until(engine: durably.Engine, wid: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while (await engine.get_workflow(wid)).status != status:
        assert time.monotonic() < deadline, f"{wid} never became {status}"
        await asyncio.sleep(0.02)


async def test_every_live_workflows_pending_approvals_and_no_other(store_url: str) -> None:
    GATE.clear()
    GATE["running"] = asyncio.Event()
    plan = [
        ("waits-old", [record("waits-old", 1)], "wait", "waiting"),
        ("waits-two", [record("waits-two", 1), record("waits-two", 2)], "wait", "waiting"),
        ("waits-decided", [record("waits-decided", 1, "approved")], "wait", "waiting"),
        ("waits-none", [], "wait", "waiting"),
        ("runs", [record("runs", 1)], "run", "running"),
        ("ended", [record("ended", 1)], "end", "completed"),
    ]
    async with durably.Engine(store_url, poll_interval=0.05) as engine:
        for wid, records, then, status in plan:
            handle = await engine.start(asking, records, then, workflow_id=wid)
            await until(engine, handle.workflow_id, status)
            await asyncio.sleep(0.01)  # created_at apart: newest first is this order reversed
        client = durably.Client(store_url)
        try:
            found = client.list_approvals()
            assert [(p.workflow_id, p.approval_id) for p in found] == [
                ("waits-two", "waits-two-call-1"),
                ("waits-two", "waits-two-call-2"),
                ("waits-old", "waits-old-call-1"),
                ("runs", "runs-call-1"),
            ]
            assert found[1].arguments == {"order": "A2", "cents": 200}
            assert await engine.list_approvals() == found
            # up to ``limit`` workflows of each status that published approvals (the
            # newest waiting one has decided all of its own: nothing of it is pending)
            newest = client.list_approvals(limit=2)
            assert [p.workflow_id for p in newest] == ["waits-two", "waits-two", "runs"]
            assert [p.workflow_id for p in client.list_approvals(limit=1)] == ["runs"]
            # one workflow's, by id, as before
            assert [p.approval_id for p in client.list_approvals("waits-old")] == [
                "waits-old-call-1"
            ]
            for bad in (0, -1, 1.5, True):
                with pytest.raises(ValueError, match="limit"):
                    client.list_approvals(limit=bad)
        finally:
            client.close()
        GATE["running"].set()
        for wid, _, then, _ in plan:
            if then == "wait":
                await engine.send_signal(wid, "go", "ok")
        for wid, *_ in plan:
            await engine.handle(wid).result(timeout=30)


def test_the_look_at_many_live_workflows_is_one_statement(store_url: str) -> None:
    """1,000 waiting and 1,000 running workflows, three of them with approvals: one
    statement (SQLite: reading workflows_by_status and the events' primary key)."""
    postgres = store_url.startswith("postgres")
    store: Any = create_store(store_url)
    store.open()
    try:
        for status in ("waiting", "running"):
            store._execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
                "INSERT INTO workflows (workflow_id, name, status, input, created_at, "
                f"updated_at) SELECT '{status}-' || CAST(i AS TEXT), 'agent', '{status}', "
                "'[]', i, i FROM n",
                {},
            )
        for wid, n in (("waiting-7", 7), ("waiting-900", 900), ("running-5", 5)):
            value = codec.encode([record(wid, n)], where="test")
            quoted = value.replace("'", "''")
            store._execute(
                "INSERT INTO events (workflow_id, key, value, seq, updated_at) "
                f"VALUES ('{wid}', '{INDEX_EVENT}', '{quoted}', 1, 1)",
                {},
            )
        if postgres:
            store._execute("ANALYZE workflows", {})
            store._execute("ANALYZE events", {})
        sent: list[str] = []
        execute = store._execute
        store._execute = lambda sql, params=None: sent.append(sql) or execute(sql, params)
        ops = operations.Operations(store, time.time)
        plan = decisions.list_plan(ops, None, 1000)
        try:
            call = next(plan)
            while True:
                call = plan.send(call.fn(*call.args))
        except StopIteration as done:
            found = done.value
        finally:
            del store._execute
        assert [p.workflow_id for p in found] == ["waiting-900", "waiting-7", "running-5"]
        assert len(sent) == 1, sent
        if not postgres:  # (PostgreSQL plans by its statistics: few events, read first)
            rows = store._execute(
                "EXPLAIN QUERY PLAN " + store._queries["live_events"],
                {"key": INDEX_EVENT, "limit": 1000},
            ).fetchall()
            shown = "\n".join(str(r[-1]) for r in rows)
            assert "workflows_by_status" in shown, shown
            assert "sqlite_autoindex_events_1" in shown, shown
    finally:
        store.close()
