"""Client and Engine make the same operator calls the same way (durably.operations).

Each test makes one call through a synchronous Client and the same call through
an Engine, on the same database, and compares what came back or what was
raised (type and message). Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import workflows
from tests import children

Outcome = tuple[str, Any]


def _capture(call: Callable[[], Any]) -> Outcome:
    try:
        return ("returned", call())
    except Exception as exc:
        return (type(exc).__name__, str(exc))


async def _capture_async(call: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        return ("returned", await call())
    except Exception as exc:
        return (type(exc).__name__, str(exc))


async def same(client_call: Callable[[], Any], engine_call: Callable[[], Awaitable[Any]]) -> Any:
    """Make the call both ways (the Client's off the event loop); assert equal outcomes."""
    by_client = await asyncio.to_thread(_capture, client_call)
    by_engine = await _capture_async(engine_call)
    assert by_client == by_engine
    return by_client


@durably.workflow(name="parity-waiter")
async def waiter(tag: str) -> str:
    durably.set_event("tag", tag)
    got = await durably.wait_for_signal("go")
    return f"{tag}:{got}"


@durably.step
async def parity_add(a: int, b: int) -> int:
    return a + b


@durably.workflow(name="parity-adder")
async def adder(n: int) -> int:
    first = await parity_add(n, 1)
    return await parity_add(first, 1)


@pytest.fixture
async def both(store_url: str) -> Any:
    with durably.Client(store_url) as client:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.2) as engine:
            yield client, engine


async def test_starting_the_same_id_twice_and_conflicts(both: Any) -> None:
    client, engine = both
    assert client.start("parity-elsewhere", 1, workflow_id="s1") == "s1"
    assert client.start("parity-elsewhere", 2, workflow_id="s1") == "s1"
    with pytest.raises(durably.WorkflowNotRegistered, match="parity-elsewhere"):
        await engine.start("parity-elsewhere", 3, workflow_id="s1")  # a typo fails at once
    info = client.get_workflow("s1")
    assert (info.status, info.input) == ("pending", '{"args":[1],"kwargs":{}}')
    assert await engine.get_workflow("s1") == info

    with pytest.raises(durably.WorkflowIdConflict, match="not 'parity-other'"):
        client.start("parity-other", workflow_id="s1")
    outcome = await same(
        lambda: client.start(adder, 1, workflow_id="s1"),
        lambda: engine.start(adder, 1, workflow_id="s1"),
    )
    assert outcome[0] == "WorkflowIdConflict"
    for bad_id in ("", "  "):
        outcome = await same(
            lambda: client.start(adder, 1, workflow_id=bad_id),  # noqa: B023
            lambda: engine.start(adder, 1, workflow_id=bad_id),  # noqa: B023
        )
        assert outcome[0] == "InvalidName"  # a ValueError
    with pytest.raises(ValueError):
        client.start("")
    with pytest.raises(durably.WorkflowNotRegistered):
        await engine.start("")

    # A workflow registered here: the Client commits it pending, the Engine runs it.
    assert client.start(adder, 5, workflow_id="s2") == "s2"
    started = await engine.start(adder, 7, workflow_id="s2")  # the existing one, claimed
    assert await started.result(timeout=10) == 7
    again = await engine.start(adder, 9, workflow_id="s2")
    assert await again.result(timeout=10) == 7
    assert client.start(adder, 9, workflow_id="s2") == "s2"


async def test_unknown_ids_raise_the_same_error(both: Any) -> None:
    client, engine = both
    calls: list[tuple[Callable[[], Any], Callable[[], Awaitable[Any]]]] = [
        (lambda: client.get_workflow("nope"), lambda: engine.get_workflow("nope")),
        (lambda: client.history("nope"), lambda: engine.history("nope")),
        (
            lambda: client.history_page("nope", limit=5),
            lambda: engine.history_page("nope", limit=5),
        ),
        (lambda: client.history_steps("nope"), lambda: engine.history_steps("nope")),
        (
            lambda: client.signals_page("nope", limit=5),
            lambda: engine.signals_page("nope", limit=5),
        ),
        (lambda: client.send_signal("nope", "go", 1), lambda: engine.send_signal("nope", "go", 1)),
        (lambda: client.get_event("nope", "k"), lambda: engine.get_event("nope", "k")),
        (
            lambda: client.get_event("nope", "k", timeout=0.05),
            lambda: engine.get_event("nope", "k", timeout=0.05),
        ),
        (lambda: client.cancel("nope"), lambda: engine.cancel("nope")),
        (lambda: client.resume("nope"), lambda: engine.resume("nope")),
        (lambda: client.fork("nope", 0, "nope-2"), lambda: engine.fork("nope", 0, "nope-2")),
        (
            lambda: client.resolve("nope", 1, retry=True),
            lambda: engine.resolve("nope", 1, retry=True),
        ),
    ]
    for client_call, engine_call in calls:
        kind, message = await same(client_call, engine_call)
        assert kind == "WorkflowNotFound"
        assert message.startswith("no workflow with id 'nope' in ")
    await same(lambda: client.claims("nope"), lambda: engine.claims("nope"))
    await same(lambda: client.signals("nope"), lambda: engine.signals("nope"))


async def test_list_filters_and_reads_match(both: Any) -> None:
    client, engine = both
    for i in range(3):
        client.start("parity-elsewhere", i, workflow_id=f"l{i}")
    done = await engine.start(adder, 1, workflow_id="l-done")
    assert await done.result(timeout=10) == 3
    for status, name, limit in [
        (None, None, 100),
        ("pending", None, 100),
        ("completed", None, 100),
        (None, "parity-elsewhere", 2),
        ("completed", "parity-elsewhere", 100),
    ]:
        rows = await same(
            lambda: client.list_workflows(status, name, limit),  # noqa: B023
            lambda: engine.list_workflows(status=status, name=name, limit=limit),  # noqa: B023
        )
        assert rows[0] == "returned"
    assert {r.workflow_id for r in client.list_workflows("pending")} == {"l0", "l1", "l2"}
    kind, _ = await same(
        lambda: client.list_workflows("sleepy"), lambda: engine.list_workflows("sleepy")
    )
    assert kind == "ValueError"
    await same(lambda: client.history("l-done"), lambda: engine.history("l-done"))
    pages: list[dict[str, Any]] = [
        {"limit": 1},
        {"limit": 5},
        {"after_seq": 0, "limit": 1},
        {"after_seq": 1, "limit": 5},
        {"before_seq": 2, "limit": 5},
        {"after_seq": 99, "limit": 5},
    ]
    for kwargs in pages:
        kind, _ = await same(
            lambda: client.history_page("l-done", **kwargs),  # noqa: B023
            lambda: engine.history_page("l-done", **kwargs),  # noqa: B023
        )
        assert kind == "returned"
    for kwargs in ({"limit": 0}, {"limit": 1, "after_seq": 0, "before_seq": 2}):
        kind, _ = await same(
            lambda: client.history_page("l-done", **kwargs),  # noqa: B023
            lambda: engine.history_page("l-done", **kwargs),  # noqa: B023
        )
        assert kind == "ValueError"
    kind, steps = await same(
        lambda: client.history_steps("l-done", "parity_"),
        lambda: engine.history_steps("l-done", "parity_"),
    )
    assert kind == "returned" and [e.name for e in steps] == ["parity_add", "parity_add"]
    await same(lambda: client.claims("l-done"), lambda: engine.claims("l-done"))
    await same(lambda: client.reviews(), lambda: engine.reviews())
    await same(lambda: client.list_approvals(), lambda: engine.list_approvals())
    assert [e.executor_id for e in client.executors()] == [engine.executor_id]
    await same(lambda: client.executors(), lambda: engine.executors())


async def test_signals_are_deduplicated_alike(both: Any) -> None:
    client, engine = both
    client.start("parity-elsewhere", workflow_id="sig")
    assert client.send_signal("sig", "go", 1, idempotency_key="k1") is True
    assert await engine.send_signal("sig", "go", 2, idempotency_key="k1") is False
    assert await engine.send_signal("sig", "go", 3, idempotency_key="k2") is True
    assert client.send_signal("sig", "go", 4, idempotency_key="k2") is False
    assert client.send_signal("sig", "go", 5) is True
    assert await engine.send_signal("sig", "go", 6) is True
    _, signals = await same(lambda: client.signals("sig"), lambda: engine.signals("sig"))
    assert [s["payload"] for s in signals] == ["1", "3", "5", "6"]
    _, page = await same(
        lambda: client.signals_page("sig", before_num=4, limit=2),
        lambda: engine.signals_page("sig", before_num=4, limit=2),
    )
    assert [s["payload"] for s in page] == ["3", "5"]
    kind, _ = await same(
        lambda: client.signals_page("sig", limit=0), lambda: engine.signals_page("sig", limit=0)
    )
    assert kind == "ValueError"
    kind, _ = await same(
        lambda: client.send_signal("sig", "go", object()),
        lambda: engine.send_signal("sig", "go", object()),
    )
    assert kind == "EncodeError"


async def test_events_cancel_resume_and_fork_alike(both: Any) -> None:
    client, engine = both
    one = await engine.start(waiter, "one", workflow_id="w1")
    two = await engine.start(waiter, "two", workflow_id="w2")
    assert await engine.get_event("w1", "tag", timeout=10) == "one"
    await same(lambda: client.get_event("w1", "tag"), lambda: engine.get_event("w1", "tag"))
    kind, _ = await same(
        lambda: client.get_event("w1", "absent", timeout=0.05),
        lambda: engine.get_event("w1", "absent", timeout=0.05),
    )
    assert kind == "TimeoutError"

    assert client.cancel("w1") == ["w1"]
    assert await engine.cancel("w2") == ["w2"]
    for handle in (one, two):
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=10)
    await same(lambda: client.cancel("w1"), lambda: engine.cancel("w2"))

    assert client.resume("w1") is None
    resumed = await engine.resume("w2")
    assert resumed.workflow_id == "w2"
    await engine.send_signal("w1", "go", "a")
    client.send_signal("w2", "go", "b")
    assert await one.result(timeout=10) == "one:a"
    assert await two.result(timeout=10) == "two:b"
    kind, message = await same(lambda: client.resume("w2"), lambda: engine.resume("w2"))
    assert (kind, message) == (
        "NotResumable",
        "workflow 'w2' is completed; only a failed, cancelled or diverged workflow, or a "
        "pending one waiting on its queue, can be resumed",
    )

    fork_id = client.fork("w1", 0)
    forked = await engine.fork("w1", 0)
    assert fork_id.startswith("w1-fork-") and forked.workflow_id.startswith("w1-fork-")
    assert fork_id != forked.workflow_id
    assert client.fork("w1", 0, "f1") == "f1"
    assert (await engine.fork("w2", 0, "f2")).workflow_id == "f2"
    kind, message = await same(
        lambda: client.fork("w1", 0, "f1"), lambda: engine.fork("w1", 0, "f1")
    )
    assert (kind, message) == ("WorkflowIdConflict", "workflow id 'f1' is already taken")
    for wid in (fork_id, "f1"):
        await engine.send_signal(wid, "go", "again")
    assert await engine.handle(fork_id).result(timeout=10) == "one:again"
    assert await engine.handle("f1").result(timeout=10) == "one:again"


async def test_resolving_nothing_raises_the_same_error(both: Any) -> None:
    client, engine = both
    done = await engine.start(adder, 1, workflow_id="r1")
    assert await done.result(timeout=10) == 3
    for kwargs in ({"retry": True}, {"result": 5}, {"fail": "no"}):
        kind, message = await same(
            lambda: client.resolve("r1", 1, by="ops", **kwargs),  # noqa: B023
            lambda: engine.resolve("r1", 1, by="ops", **kwargs),  # noqa: B023
        )
        assert kind == "NothingToResolve"
    kind, message = await same(lambda: client.resolve("r1", 1), lambda: engine.resolve("r1", 1))
    assert kind == "ValueError" and "exactly one" in message


# --- Engine.start of a workflow this process does not define --------------------------

REMOTE_FLOWS = """
import durably

@durably.workflow(name="parity-remote-double")
async def remote_double(n: int) -> int:
    return await durably.run_step(lambda: n * 2, name="double")
"""


@pytest.fixture
def remote_worker(store_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process that defines ``parity-remote-double`` (this process does not)."""
    (tmp_path / "parity_remote_flows.py").write_text(textwrap.dedent(REMOTE_FLOWS))
    env = children.child_env()
    argv = children.durably_cli(store_url, "worker", "parity_remote_flows", "--poll", "0.2")
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def test_a_name_defined_elsewhere_is_committed_by_the_client_for_a_worker(
    store_url: str, remote_worker: subprocess.Popen[bytes]
) -> None:
    assert workflows.registered("parity-remote-double") is None
    async with durably.Engine(store_url, poll_interval=0.2) as engine:
        with pytest.raises(durably.WorkflowNotRegistered):
            await engine.start("parity-remote-double", 21, workflow_id="remote-1")
    with durably.Client(store_url) as client:
        client.start("parity-remote-double", 21, workflow_id="remote-1")
        client.start("parity-remote-double", 5, workflow_id="remote-2")
    async with durably.Engine(store_url, poll_interval=0.2) as engine:
        assert await engine.handle("remote-1").result(timeout=30) == 42
        claims = await engine.claims("remote-1")
        assert claims and all(c.owner != engine.executor_id for c in claims)
    async with durably.Engine(store_url) as engine:
        assert await engine.handle("remote-2").result(timeout=30) == 10
    assert remote_worker.poll() is None, "the worker died"


# --- one wake-up timer per engine ---------------------------------------------------------


async def test_parks_keep_one_timer_for_the_earliest_wake_up(sqlite_url: str) -> None:
    async with durably.Engine(sqlite_url) as engine:
        now = engine.clock()
        engine._wake_later(now + 60)
        first = engine._timer
        engine._wake_later(now + 30)  # earlier: replaces it
        second = engine._timer
        engine._wake_later(now + 90)  # later: the recovery loop reads it from next_wake
        engine._wake_later(None)
        assert first is not None and first.cancelled()
        assert second is engine._timer and second is not None and not second.cancelled()
        assert engine._timer_at == now + 30
        engine._wake_later(now)  # due now: fires at once and kicks recovery
        await asyncio.sleep(0.05)
        assert engine._timer is None and second.cancelled()
        engine._wake_later(now + 120)
        assert engine._timer is not None
    assert engine._timer is None  # closing cancels it
