"""Operations at scale: list by ids, id prefix, time, parent and queue with paging and
order; delete a workflow with every row that names it; cancel, resume and delete by
filter. Through Client, Engine and the command line, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably import cli
from durably.queues import Queue
from durably.storage import base, create_store

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def engine(url: str, **kw: Any) -> durably.Engine:
    kw.setdefault("hold_seconds", 0.05)
    kw.setdefault("poll_interval", 0.1)
    return durably.Engine(url, **kw)


def run_cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli.main, ["--database", url, *args])


@durably.step
async def note(text: str) -> str:
    RAN.append(text)
    return text


@durably.workflow(name="ld.item")
async def item(text: str) -> str:
    return await note(text)


@durably.workflow(name="ld.waiter")
async def waiter() -> Any:
    durably.set_event("stage", "waiting")
    return await durably.wait_for_signal("go")


@durably.workflow(name="ld.boss")
async def boss() -> list[str]:
    kids = [await durably.start_child(item, f"kid {i}", workflow_id=f"b-kid-{i}") for i in (1, 2)]
    return [await k.result() for k in kids]


async def parked(e: durably.Engine, workflow_id: str) -> None:
    """Wait until the workflow is parked waiting for its signal (fail after 10 s)."""
    deadline = time.monotonic() + 10
    while (await e.get_workflow(workflow_id)).status != "waiting":
        if time.monotonic() > deadline:
            raise AssertionError(f"{workflow_id} never parked")
        await asyncio.sleep(0.02)


def ids(rows: list[durably.WorkflowInfo]) -> list[str]:
    return [w.workflow_id for w in rows]


def fill(url: str) -> None:
    """Workflows created one second apart (a clock given to the store), oldest a-1."""
    store = create_store(url)
    store.open()
    try:
        for i, (wid, queue, parent) in enumerate(
            [
                ("a-1", None, None),
                ("a-2", "q1", None),
                ("a_3", None, "a-1"),
                ("b-1", "q1", "a-1"),
                ("b-2", None, None),
            ]
        ):
            new = base.NewWorkflow(
                wid,
                "ld.item",
                '{"args":["x"],"kwargs":{}}',
                None,
                None,
                parent_id=parent,
                queue=queue,
            )
            op = base.Op(store.create_workflow, (new, None, None, 1000.0 + i), True)
            store.run_batch([op])
            assert op.error is None, op.error
    finally:
        store.close()


def test_list_by_ids_prefix_time_parent_queue_with_order_and_paging(store_url: str) -> None:
    fill(store_url)
    with durably.Client(store_url) as c:
        assert ids(c.list_workflows()) == ["b-2", "b-1", "a_3", "a-2", "a-1"]
        assert ids(c.list_workflows(order="asc")) == ["a-1", "a-2", "a_3", "b-1", "b-2"]
        assert ids(c.list_workflows(ids=["b-1", "a-1", "nope"])) == ["b-1", "a-1"]
        assert ids(c.list_workflows(ids=[])) == []
        assert ids(c.list_workflows(id_prefix="a-")) == ["a-2", "a-1"]  # "_" is no wildcard
        assert ids(c.list_workflows(id_prefix="a_")) == ["a_3"]
        assert ids(c.list_workflows(parent_id="a-1")) == ["b-1", "a_3"]
        assert ids(c.list_workflows(queue="q1", order="asc")) == ["a-2", "b-1"]
        assert ids(c.list_workflows(created_after=1001.0, created_before=1003.0)) == [
            "a_3",
            "a-2",
        ]
        since = datetime.datetime.fromtimestamp(1003.0, datetime.UTC)
        assert ids(c.list_workflows(created_after=since)) == ["b-2", "b-1"]
        assert ids(c.list_workflows(limit=2, offset=2)) == ["a_3", "a-2"]
        page1 = c.list_workflows(limit=2, order="asc")
        page2 = c.list_workflows(limit=2, order="asc", after=page1[-1].workflow_id)
        page3 = c.list_workflows(limit=2, order="asc", after=page2[-1].workflow_id)
        assert ids(page1 + page2 + page3) == ["a-1", "a-2", "a_3", "b-1", "b-2"]
        back = c.list_workflows(limit=3, after="a_3")
        assert ids(back) == ["a-2", "a-1"]
        assert ids(c.list_workflows(ids=["a-1", "a-2", "b-2"], order="asc", limit=2)) == [
            "a-1",
            "a-2",
        ]
        with pytest.raises(ValueError, match="order"):
            c.list_workflows(order="sideways")
        with pytest.raises(ValueError, match="offset"):
            c.list_workflows(offset=-1)
        with pytest.raises(durably.WorkflowNotFound, match="ghost"):
            c.list_workflows(after="ghost")


async def test_engine_lists_with_the_same_filters(store_url: str) -> None:
    fill(store_url)
    async with engine(store_url) as e:
        assert ids(await e.list_workflows(id_prefix="b", order="asc")) == ["b-1", "b-2"]
        assert ids(await e.list_workflows(parent_id="a-1", limit=1)) == ["b-1"]


def test_cli_list_filters(store_url: str) -> None:
    fill(store_url)
    out = run_cli(store_url, "list", "--json", "--prefix", "a", "--order", "asc")
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["workflow_id"] for line in out.output.splitlines()] == [
        "a-1",
        "a-2",
        "a_3",
    ]
    args = ["list", "--json", "--id", "b-2", "--id", "a-1", "--queue", "q1"]
    assert run_cli(store_url, *args).output.strip() == ""
    out = run_cli(store_url, "list", "--json", "--parent", "a-1", "--after", "b-1")
    assert [json.loads(line)["workflow_id"] for line in out.output.splitlines()] == ["a_3"]
    since = datetime.datetime.fromtimestamp(1003.0, datetime.UTC).isoformat()
    out = run_cli(store_url, "list", "--json", "--since", since, "--offset", "1")
    assert [json.loads(line)["workflow_id"] for line in out.output.splitlines()] == ["b-1"]
    out = run_cli(store_url, "list", "--until", since, "--limit", "1")
    assert out.exit_code == 0 and "a_3" in out.output and "a-2" not in out.output


async def test_delete_removes_a_finished_workflow_and_every_row_naming_it(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        await e.start(waiter, workflow_id="w")
        await e.send_signal("w", "go", "yes")
        assert await e.handle("w").result(timeout=10) == "yes"
        await e.start(item, "keep", workflow_id="keep")
        assert await e.handle("keep").result(timeout=10) == "keep"
        assert await e.delete("w") == ["w"]
        with pytest.raises(durably.WorkflowNotFound):
            await e.get_workflow("w")
        assert await e.history("keep") != []
        with pytest.raises(durably.WorkflowNotFound, match="w"):
            await e.delete("w")
    store = create_store(store_url)
    store.open()
    try:
        op = base.Op(store.export_workflows, (["keep"],), False)
        store.run_batch([op])
        assert op.result[0].rows["journal"]
        assert store.get_event("w", "stage") is None
        assert store.list_signals("w") == [] and store.load_claims("w") == []
        assert store.load_history("w") == []
    finally:
        store.close()


async def test_delete_refuses_an_unfinished_workflow_unless_forced(store_url: str) -> None:
    async with engine(store_url) as e:
        await e.start(waiter, workflow_id="w")
        assert await e.get_event("w", "stage", timeout=10) == "waiting"
        with pytest.raises(durably.WorkflowNotFinished, match=r"'w' is (waiting|running)"):
            await e.delete("w")
        assert (await e.get_workflow("w")).status in ("waiting", "running")
    with durably.Client(store_url) as client:
        assert client.delete("w", force=True) == ["w"]
        assert client.list_workflows() == []


async def test_delete_of_a_parent_takes_its_children_along(store_url: str) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(boss, workflow_id="boss")).result(timeout=10) == [
            "kid 1",
            "kid 2",
        ]
        with pytest.raises(durably.WorkflowNotFound):
            await e.delete("b-kid-1", "nope")  # all or nothing: b-kid-1 stays
        assert sorted(await e.delete("boss")) == ["b-kid-1", "b-kid-2", "boss"]
        assert await e.list_workflows() == []


async def test_cancel_resume_and_delete_by_filter(store_url: str) -> None:
    q = Queue("ld-unserved")
    async with engine(store_url) as e:
        for i in range(3):
            await e.start(waiter, workflow_id=f"w{i}")
        await e.start(item, "done", workflow_id="done")
        for i in range(3):
            await parked(e, f"w{i}")
        assert await e.handle("done").result(timeout=10) == "done"
        cancelled = await e.cancel_workflows(status="waiting", name="ld.waiter")
        assert sorted(cancelled) == ["w0", "w1", "w2"]
        for i in range(3):
            with pytest.raises(durably.Cancelled):
                await e.handle(f"w{i}").result(timeout=10)
        assert await e.handle("done").status() == "completed"
        resumed = await e.resume_workflows(status="cancelled", id_prefix="w", ids=["w0", "w2"])
        assert sorted(resumed) == ["w0", "w2"]
        await e.send_signal("w0", "go", 0)
        assert await e.handle("w0").result(timeout=10) == 0
        assert await e.handle("w1").status() == "cancelled"
        await q.enqueue(e, item, "queued", workflow_id="qd")
    with durably.Client(store_url) as client:
        assert client.resume_workflows(queue="ld-unserved") == ["qd"]
        assert client.get_workflow("qd").queue is None
        with pytest.raises(ValueError, match="at least one filter"):
            client.delete_workflows()
        with pytest.raises(ValueError, match="no 'limit'"):
            client.cancel_workflows(status="waiting", limit=2)
        assert sorted(client.delete_workflows(status="completed")) == ["done", "w0"]
        assert sorted(ids(client.list_workflows())) == ["qd", "w1", "w2"]


def test_cli_cancel_resume_and_delete_by_filter(store_url: str) -> None:
    fill(store_url)
    out = run_cli(store_url, "cancel", "--prefix", "a", "--queue", "q1")
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["a-2"]
    with durably.Client(store_url) as client:
        a2 = client.get_workflow("a-2")
        assert (a2.cancel_requested, a2.status) == (1, "cancelled")  # never started: final
        assert client.get_workflow("b-1").cancel_requested == 0
    refused = run_cli(store_url, "delete", "--prefix", "b")
    assert refused.exit_code == 1
    assert "b-1" in refused.output and "--force" in refused.output
    missing = run_cli(store_url, "delete", "b-1", "ghost", "--force")
    assert missing.exit_code == 1 and "ghost" in missing.output
    out = run_cli(store_url, "delete", "b-1", "b-2", "--force")
    assert out.exit_code == 0, out.output
    assert sorted(out.output.split()) == ["b-1", "b-2"]
    nothing = run_cli(store_url, "cancel")
    assert nothing.exit_code != 0 and "ID or a filter" in nothing.output
    out = run_cli(store_url, "resume", "--status", "cancelled", "--no-wait", "--queue", "q1")
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["a-2"]


GATE: dict[str, Any] = {}


@durably.step
async def gated(text: str) -> str:
    RAN.append(text)
    await GATE["open"].wait()
    return text


@durably.workflow(name="ld.busy")
async def busy() -> str:
    first = await gated("first")
    return await note(first + " then")


async def test_force_delete_of_a_running_workflow_fences_its_run_out(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    GATE["open"] = asyncio.Event()
    async with engine(store_url) as e:
        try:
            await e.start(busy, workflow_id="busy")
            deadline = time.monotonic() + 10
            while RAN != ["first"]:
                assert time.monotonic() < deadline, "the step never started"
                await asyncio.sleep(0.02)
            with durably.Client(store_url) as client:
                with pytest.raises(durably.WorkflowNotFinished, match="running"):
                    client.delete("busy")
                assert client.delete("busy", force=True) == ["busy"]
        finally:
            GATE["open"].set()
        deadline = time.monotonic() + 10
        while "busy" in e._tasks:  # the run ends: its next write finds no workflow
            assert time.monotonic() < deadline, "the run of a deleted workflow went on"
            await asyncio.sleep(0.02)
        assert await e.list_workflows() == []
    assert RAN == ["first"]  # nothing ran after the delete


@durably.workflow(name="ld.starter")
async def starter() -> Any:
    kid = await durably.start_child(item, "kid", workflow_id="s-kid")
    got = await durably.wait_for_signal("go")
    return [got, await kid.result()]


async def test_a_child_of_an_unfinished_parent_is_not_deleted_alone(store_url: str) -> None:
    async with engine(store_url) as e:
        await e.start(starter, workflow_id="s")
        await parked(e, "s")  # after it started its child
        assert await e.handle("s-kid").result(timeout=10) == "kid"
        with pytest.raises(durably.WorkflowNotFinished, match="child of 's'"):
            await e.delete("s-kid")
        assert await e.history("s-kid")  # still there, journal and all
        await e.send_signal("s", "go", 1)
        assert await e.handle("s").result(timeout=10) == [1, "kid"]
        assert await e.delete("s-kid") == ["s-kid"]  # its parent has finished
        assert ids(await e.list_workflows()) == ["s"]


def test_many_ids_are_read_a_few_hundred_a_statement_in_order_with_filters(
    store_url: str,
) -> None:
    """600 ids (some twice, some unknown) take three statements of at most 256 ids; the
    rows come back once each, ordered and paged as any page, with the other filters."""
    store = create_store(store_url)
    store.open()
    try:
        for i in range(300):
            new = base.NewWorkflow(f"w-{i:03d}", "ld.item", "{}", None, None)
            op = base.Op(store.create_workflow, (new, None, None, 2000.0 + i // 2), True)
            store.run_batch([op])
            assert op.error is None, op.error
        wanted = [f"w-{i:03d}" for i in range(299, -1, -1)] + [f"nope-{i}" for i in range(250)]
        wanted += ["w-007", "w-150"]  # again
        sent: list[str] = []
        execute = store._execute  # type: ignore[attr-defined]
        store._execute = lambda sql, p=None: sent.append(sql) or execute(sql, p)  # type: ignore[attr-defined]
        page = store.search_workflows(base.WorkflowQuery(ids=tuple(wanted), limit=1000))
        del store._execute  # type: ignore[attr-defined]
        reads = [sql for sql in sent if "FROM workflows" in sql]
        assert len(reads) == 3, reads  # 552 distinct ids: 256 + 256 + 40
        # newest first, ties on created_at by id
        expected = sorted((f"w-{i:03d}" for i in range(300)), key=lambda w: w)
        expected.sort(key=lambda w: 2000.0 + int(w[2:]) // 2, reverse=True)
        assert [w.workflow_id for w in page] == expected
        oldest = store.search_workflows(
            base.WorkflowQuery(ids=tuple(wanted), order="asc", limit=3, offset=1)
        )
        assert [w.workflow_id for w in oldest] == ["w-001", "w-002", "w-003"]
        late = store.search_workflows(
            base.WorkflowQuery(ids=tuple(wanted), created_after=2148.0, limit=1000)
        )
        assert [w.workflow_id for w in late] == ["w-298", "w-299", "w-296", "w-297"]
        # a cursor with ids, both ways: the page past it, as without ids
        for order in ("desc", "asc"):
            past = base.WorkflowQuery(ids=tuple(wanted), after=(2050.0, "w-100"), order=order)
            plain = base.WorkflowQuery(after=(2050.0, "w-100"), order=order, limit=3)
            got = store.search_workflows(dataclasses.replace(past, limit=3))
            assert got == store.search_workflows(plain), order
        newest = [w.workflow_id for w in store.search_workflows(base.WorkflowQuery(
            ids=tuple(wanted), after=(2050.0, "w-100"), limit=3))]  # fmt: skip
        assert newest == ["w-101", "w-098", "w-099"]  # ties on created_at by id
    finally:
        store.close()


@durably.workflow(name="ld.detached")
async def detached() -> str:
    kid = await durably.start_child(waiter, workflow_id="d-kid")
    return kid.workflow_id


async def test_delete_of_a_parent_with_an_unfinished_child_is_refused_by_name(
    store_url: str,
) -> None:
    """A finished parent goes with its children: one still waiting refuses the delete with
    WorkflowHasUnfinishedChildren (a WorkflowNotFinished) naming the child, unless forced."""
    async with engine(store_url) as e:
        assert await (await e.start(detached, workflow_id="d")).result(timeout=10) == "d-kid"
        await parked(e, "d-kid")
        with pytest.raises(durably.errors.WorkflowHasUnfinishedChildren, match="'d-kid'"):
            await e.delete("d")
        still = "child 'd-kid' that is still waiting"
        with pytest.raises(durably.WorkflowNotFinished, match=still):
            await e.delete_workflows(ids=["d"])
        assert sorted(ids(await e.list_workflows())) == ["d", "d-kid"]
    refused = run_cli(store_url, "delete", "d")
    assert refused.exit_code == 1
    assert "'d-kid' that is still waiting" in refused.output and "--force" in refused.output
    out = run_cli(store_url, "delete", "d", "--force")
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["d", "d-kid"]


def while_held(store_url: str, change: Any, bulk: Any) -> Any:
    """``bulk(client)`` run while a real store holds ``change(store)`` in a transaction not
    yet committed (its rows locked), committed once the bulk call has started and waits
    for it; the bulk call's answer."""
    holder: Any = create_store(store_url)
    holder.open()
    try:
        holder._begin(True)
        change(holder)
        with durably.Client(store_url) as client, ThreadPoolExecutor(1) as pool:
            running = pool.submit(bulk, client)
            time.sleep(1.0)  # the bulk call starts, and waits for the change's lock
            assert not running.done(), running.result()
            holder._commit()
            return running.result(timeout=30)
    finally:
        holder.close()


def test_a_forced_delete_by_filter_decides_on_the_rows_it_deletes(store_url: str) -> None:
    """delete_workflows(status=..., force=True) selected in one transaction and deleted in
    another: a workflow resumed in between, no longer of the status asked for, was deleted
    on the stale read (force skips the status check). Now it selects and deletes in one
    transaction, the rows locked and read again: the resumed workflow stays."""
    with durably.Client(store_url) as client:
        client.start(waiter, workflow_id="c")
        assert client.cancel("c") == ["c"]  # never started: cancelled at once
        assert client.get_workflow("c").status == "cancelled"

    def resume(db: Any) -> None:  # a resume under way: the row locked, not yet committed
        assert db.reopen("c", time.time()).status == "pending"

    deleted = while_held(
        store_url, resume, lambda c: c.delete_workflows(status="cancelled", force=True)
    )
    assert deleted == []
    with durably.Client(store_url) as client:
        assert client.get_workflow("c").status == "pending"


def _claim_a(db: Any) -> None:
    """An executor claims "a" (the only ld.waiter): pending no longer, running."""
    now = time.time()
    assert ids(db.claim_next("ex-other", [("ld.waiter", None)], now + 60, now, 10)) == ["a"]


def _delete_a(db: Any) -> None:
    assert db.delete_workflows(["a"], True) == ["a"]


def _resume_a(db: Any) -> None:
    assert db.reopen("a", time.time()).status == "pending"


@pytest.mark.parametrize(
    ("cancelled_first", "change", "bulk"),
    [
        (False, _claim_a, lambda c: c.cancel_workflows(status="pending")),
        (False, _delete_a, lambda c: c.cancel_workflows(status="pending")),
        (True, _resume_a, lambda c: c.resume_workflows(status="cancelled")),
    ],
    ids=["cancel-one-claimed", "cancel-one-deleted", "resume-one-resumed"],
)
def test_a_cancel_or_resume_by_filter_decides_on_the_rows_it_changes(
    store_url: str, cancelled_first: bool, change: Any, bulk: Any
) -> None:
    """cancel_workflows and resume_workflows by filter selected in one transaction and
    acted in another: a workflow changed in between was acted on as read. One claimed
    meanwhile (running, no longer pending) was asked to stop by a cancel of the pending
    ones; one deleted, or resumed by someone else, failed the whole call (WorkflowNotFound,
    NotResumable), the others untouched. Now each chooses and acts in one transaction, the
    rows locked and read again: only "b", which still matches, is acted on."""
    with durably.Client(store_url) as client:
        client.start(waiter, workflow_id="a")  # never run here: pending, epoch 0
        client.start(item, "b", workflow_id="b")
        if cancelled_first:
            assert client.cancel_workflows(ids=["a", "b"]) == ["a", "b"]
    assert while_held(store_url, change, bulk) == ["b"]
    with durably.Client(store_url) as client:
        rows = {w.workflow_id: w for w in client.list_workflows()}
    assert rows["b"].status == ("pending" if cancelled_first else "cancelled")
    if "a" in rows:  # claimed, or resumed: as its own change left it, not asked to stop
        assert (rows["a"].status, rows["a"].cancel_requested) in [("running", 0), ("pending", 0)]
