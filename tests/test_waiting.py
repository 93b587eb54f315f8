"""Waiting without a process, in one process: timers, signals, events, children, cancel.

Every test runs on each backend (``store_url``: SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from typing import Any

import pytest

import durably

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def engine(url: str, **kw: Any) -> durably.Engine:
    kw.setdefault("hold_seconds", 0.05)
    kw.setdefault("poll_interval", 0.2)
    return durably.Engine(url, **kw)


@durably.step
async def note(text: str) -> str:
    RAN.append(text)
    return text


@durably.workflow
async def nap(seconds: float) -> str:
    await note("before")
    await durably.sleep(seconds)
    return await note("after")


async def test_sleep_parks_the_workflow_and_wakes_it(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(nap, 0.6, workflow_id="nap")
        await asyncio.sleep(0.3)
        info = await handle.info()
        assert (info.status, info.owner) == ("sleeping", None)
        assert "nap" not in e._tasks  # no task is held for it
        started = time.monotonic()
        assert await handle.result(timeout=5) == "after"
        assert time.monotonic() - started < 1.0
        kinds = [(x.kind, x.status) for x in await e.history("nap")]
    assert RAN == ["before", "after"]
    assert kinds == [("step", "completed"), ("sleep", "completed"), ("step", "completed")]


@durably.workflow
async def two_waits() -> list[Any]:
    first = await durably.wait_for_signal("approval")
    second = await durably.wait_for_signal("approval")
    late = await durably.wait_for_signal("never", timeout=0.2)
    return [first, second, late]


async def test_signals_are_kept_deduplicated_and_taken_in_order(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(two_waits, workflow_id="sig")
        assert await e.send_signal("sig", "approval", {"n": 1}, idempotency_key="k1")
        assert not await e.send_signal("sig", "approval", {"n": 1}, idempotency_key="k1")
        assert await e.send_signal("sig", "approval", {"n": 2})
        assert await handle.result(timeout=5) == [{"n": 1}, {"n": 2}, None]
        history = await e.history("sig")
    assert [(x.kind, x.name, x.status) for x in history] == [
        ("signal", "approval", "completed"),
        ("signal", "approval", "completed"),
        ("signal", "never", "timed_out"),
    ]


async def test_a_waiting_workflow_holds_nothing_and_wakes_on_a_signal(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(two_waits, workflow_id="w")
        await asyncio.sleep(0.3)
        assert (await handle.info()).status == "waiting"
        assert "w" not in e._tasks
        await e.send_signal("w", "approval", "yes")
        await e.send_signal("w", "approval", "again")
        assert await handle.result(timeout=5) == ["yes", "again", None]


async def test_signal_to_an_unknown_workflow(store_url: str) -> None:
    async with engine(store_url) as e:
        with pytest.raises(durably.WorkflowNotFound, match="ghost"):
            await e.send_signal("ghost", "x")


@durably.workflow
async def publisher() -> str:
    durably.set_event("stage", "looked up")
    await durably.wait_for_signal("go")
    durably.set_event("stage", {"done": True})
    return "ok"


async def test_events_are_readable_from_outside(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(publisher, workflow_id="pub")
        assert await e.get_event("pub", "stage", timeout=5) == "looked up"
        with durably.Client(store_url) as client:
            assert client.get_event("pub", "stage") == "looked up"
        with pytest.raises(TimeoutError):
            await e.get_event("pub", "missing", timeout=0.1)
        await e.send_signal("pub", "go")
        assert await handle.result(timeout=5) == "ok"
        assert await e.get_event("pub", "stage") == {"done": True}


class ChildFailed(Exception):
    pass


@durably.workflow
async def child(n: int) -> int:
    await note(f"child {n}")
    if n == 3:
        raise ChildFailed(f"child {n} failed")
    return n * n


@durably.workflow
async def parent(count: int) -> dict[str, Any]:
    handles = [await durably.start_child(child, n) for n in range(count)]
    results = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
    return {
        "ok": [r for r in results if not isinstance(r, BaseException)],
        "failed": [str(r) for r in results if isinstance(r, BaseException)],
        "ids": [h.workflow_id for h in handles],
    }


async def test_children_fan_out_and_a_failure_reaches_the_parent(store_url: str) -> None:
    async with engine(store_url) as e:
        result = await (await e.start(parent, 6, workflow_id="p")).result(timeout=10)
    assert result["ok"] == [0, 1, 4, 16, 25]
    assert result["failed"] == ["child 3 failed"]
    assert result["ids"] == [f"p:{n + 1}" for n in range(6)]  # deterministic child ids
    assert sorted(RAN) == sorted(f"child {n}" for n in range(6))


@durably.workflow
async def cancellable(kind: str) -> str:
    try:
        if kind == "sleep":
            await durably.sleep(30)
        elif kind == "wait":
            await durably.wait_for_signal("never")
        else:
            await slow_note("slow")
            await note("after the slow step")
        return "finished"
    finally:
        await note(f"cleanup {kind}")


@durably.step
async def slow_note(text: str) -> str:
    await asyncio.sleep(0.3)
    RAN.append(text)
    return text


@pytest.mark.parametrize("kind", ["sleep", "wait", "step"])
async def test_cancel_reaches_the_next_durable_call_and_finally_runs(
    store_url: str, kind: str
) -> None:
    async with engine(store_url) as e:
        handle = await e.start(cancellable, kind, workflow_id=f"c-{kind}")
        await asyncio.sleep(0.15)
        assert await e.cancel(f"c-{kind}") == [f"c-{kind}"]
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=5)
        assert (await handle.info()).status == "cancelled"
        kinds = [x.kind for x in await e.history(f"c-{kind}")]
    assert RAN[-1] == f"cleanup {kind}"
    assert "after the slow step" not in RAN
    if kind == "step":
        assert RAN[0] == "slow"  # the running step finished and kept its receipt
    assert "cancel" in kinds


FAIL_ONCE = {"armed": True}


@durably.step
async def fragile() -> str:
    if FAIL_ONCE["armed"]:
        raise RuntimeError("fragile broke")
    return "fixed"


@durably.workflow
async def resumable() -> list[str]:
    a = await note("a")
    b = await fragile()
    return [a, b]


async def test_resume_retries_the_step_that_failed(store_url: str) -> None:
    FAIL_ONCE["armed"] = True
    async with engine(store_url) as e:
        handle = await e.start(resumable, workflow_id="r")
        with pytest.raises(RuntimeError, match="fragile broke"):
            await handle.result(timeout=5)
        FAIL_ONCE["armed"] = False
        await e.resume("r")
        assert await handle.result(timeout=5) == ["a", "fixed"]
    assert RAN == ["a"]


@durably.workflow
async def five_steps() -> list[str]:
    return [await note(f"s{n}") for n in range(1, 6)]


async def test_fork_copies_the_first_entries_and_runs_the_rest(store_url: str) -> None:
    async with engine(store_url) as e:
        await (await e.start(five_steps, workflow_id="orig")).result(timeout=5)
        RAN.clear()
        forked = await e.fork("orig", from_seq=3, workflow_id_new="orig-fork")
        assert await forked.result(timeout=5) == ["s1", "s2", "s3", "s4", "s5"]
    assert RAN == ["s4", "s5"]


@durably.workflow
async def sleeper_or_waiter(n: int, until: float) -> int:
    if n % 2:
        await durably.sleep_until(datetime.datetime.fromtimestamp(until, datetime.UTC))
    else:
        await durably.wait_for_signal("go")
    return n


async def test_a_thousand_parked_workflows_hold_no_task_or_thread(store_url: str) -> None:
    count = 1000
    async with engine(store_url, hold_seconds=0.0) as e:
        baseline_tasks = len(asyncio.all_tasks())
        baseline_threads = threading.active_count()
        # PostgreSQL pays a round trip per statement: parking 1000 takes seconds there.
        until = time.time() + (3 if store_url.startswith("sqlite") else 6)
        started = time.monotonic()
        handles = await asyncio.gather(
            *(e.start(sleeper_or_waiter, n, until, workflow_id=f"m{n}") for n in range(count))
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            parked = await e.list_workflows(status="waiting", limit=count)
            sleeping = await e.list_workflows(status="sleeping", limit=count)
            if len(parked) + len(sleeping) == count:
                break
            await asyncio.sleep(0.05)
        print(f"{count} workflows started and parked in {time.monotonic() - started:.1f}s")
        assert len(parked) == count // 2 and len(sleeping) == count // 2
        assert len(asyncio.all_tasks()) <= baseline_tasks + 2
        assert threading.active_count() <= baseline_threads + 1
        for n in range(0, count, 2):
            await e.send_signal(f"m{n}", "go")
        results = [await h.result(timeout=30) for h in handles]
    assert results == list(range(count))


async def test_client_starts_work_that_an_engine_runs(store_url: str) -> None:
    with durably.Client(store_url) as client:
        wid = client.start(two_waits, workflow_id="from-client")
        assert client.get_workflow(wid).status == "pending"
        client.send_signal(wid, "approval", 1)
        client.send_signal(wid, "approval", 2)
    async with engine(store_url) as e:
        assert await e.handle("from-client").result(timeout=5) == [1, 2, None]
