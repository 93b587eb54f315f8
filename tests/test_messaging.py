"""Messaging from workflow code: ``durably.send_signal``, ``durably.get_event`` inside a
workflow, and ``durably.set_event`` from a step (issue 14, "Missing: messaging").

Each workflow parks after its message (a short ``hold_seconds`` and a durable
sleep) so that the test sees what its replay does. Every test runs on each
backend (``store_url``: SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

import durably
from durably import messages

RAN: list[str] = []  # one line per step invocation
SEEN: list[Any] = []  # what workflow code saw, once per run (first run, then replays)


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    SEEN.clear()


def engine(url: str) -> durably.Engine:
    return durably.Engine(url, hold_seconds=0.05, poll_interval=0.2)


async def park(seconds: float = 0.3) -> None:
    """Let the run park (hold 0.05 s) and be replayed from its first line."""
    await durably.sleep(seconds)


@durably.workflow(name="msg.receiver")
async def receiver(count: int) -> list[Any]:
    return [await durably.wait_for_signal("go") for _ in range(count)]


# --- send_signal --------------------------------------------------------------------------


@durably.workflow(name="msg.sender")
async def sender(target: str) -> str:
    await durably.send_signal(target, "go", {"from": durably.workflow_id()})
    SEEN.append("sent")
    await park()
    return "done"


async def test_send_signal_from_a_workflow_is_sent_once_across_its_replay(store_url: str) -> None:
    async with engine(store_url) as e:
        target = await e.start(receiver, 1, workflow_id="target")
        handle = await e.start(sender, "target", workflow_id="sender")
        assert await handle.result(timeout=10) == "done"
        assert await target.result(timeout=10) == [{"from": "sender"}]
        signals = await e.signals("target")
        history = await e.history("sender")
        claims = await e.claims("sender")
    assert SEEN == ["sent", "sent"] and len(claims) == 2  # it parked and was replayed
    assert [(s["name"], s["idempotency_key"]) for s in signals] == [("go", "sender:1")]
    assert (history[0].kind, history[0].name, history[0].status) == (
        "send_signal",
        "go -> target",
        "completed",
    )


@durably.workflow(name="msg.to_nobody")
async def to_nobody(target: str) -> str:
    try:
        await durably.send_signal(target, "go")
        outcome = "sent"
    except durably.WorkflowNotFound as exc:
        outcome = f"not found: {exc}"
    SEEN.append(outcome)
    await park(0.5)
    return outcome


async def test_a_send_to_an_unknown_workflow_raises_and_its_replay_raises_the_same(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        handle = await e.start(to_nobody, "ghost", workflow_id="lonely")
        await asyncio.wait_for(_until(lambda: len(SEEN) == 1), 10)
        # the target exists by the replay: the journaled failure still decides
        await e.start(receiver, 1, workflow_id="ghost")
        result = await handle.result(timeout=10)
        assert await e.signals("ghost") == []
    assert result.startswith("not found:") and "ghost" in result
    assert [result, result] == SEEN


@durably.workflow(name="msg.pen_pal")
async def pen_pal(other: str) -> Any:
    await durably.send_signal(other, "letter", durably.workflow_id())
    return await durably.wait_for_signal("letter")


async def test_workflows_sending_to_each_other_at_once_each_get_one_letter(
    store_url: str,
) -> None:
    # Each send locks the sender's row, then the target's: pairs sending to each other
    # at once may deadlock on PostgreSQL, which aborts one; its write is retried.
    async with engine(store_url) as e:
        handles = []
        for n in range(6):
            a, b = f"pal-{n}-a", f"pal-{n}-b"
            handles += [await e.start(pen_pal, b, workflow_id=a)]
            handles += [await e.start(pen_pal, a, workflow_id=b)]
        results = await asyncio.gather(*(h.result(timeout=30) for h in handles))
        counts = [len(await e.signals(h.workflow_id)) for h in handles]
    assert results == [f"pal-{n}-{x}" for n in range(6) for x in ("b", "a")]
    assert counts == [1] * 12


def test_send_signal_outside_a_workflow_is_refused() -> None:
    with pytest.raises(durably.NotInWorkflow, match=r"durably\.send_signal\(\)"):
        durably.send_signal("x", "go")


# --- get_event in workflow code ---------------------------------------------------------------


@durably.step
async def publish(value: int) -> int:
    RAN.append(f"publish {value}")
    return value


@durably.workflow(name="msg.publisher")
async def publisher() -> str:
    durably.set_event("stage", 1)
    await publish(1)
    await durably.wait_for_signal("next")
    durably.set_event("stage", 2)
    await publish(2)
    return "published"


@durably.workflow(name="msg.reader")
async def reader(source: str) -> list[Any]:
    first = await durably.get_event(source, "stage", timeout=5)
    SEEN.append(first)
    await park(0.6)
    try:
        missing = await durably.get_event(source, "never", timeout=0.2)
    except TimeoutError:
        missing = "timed out"
    return [first, missing]


async def test_get_event_in_a_workflow_replays_the_value_it_read(store_url: str) -> None:
    async with engine(store_url) as e:
        source = await e.start(publisher, workflow_id="source")
        handle = await e.start(reader, "source", workflow_id="reader")
        await asyncio.wait_for(_until(lambda: len(SEEN) == 1), 10)
        # the source publishes a newer value while the reader is parked
        await e.send_signal("source", "next")
        assert await source.result(timeout=10) == "published"
        assert await e.get_event("source", "stage") == 2
        assert await handle.result(timeout=10) == [1, "timed out"]
        history = await e.history("reader")
    # every replay (after the park, and after the wait for "never" parked) returned the
    # journaled value, not the store's 2
    assert len(SEEN) >= 2 and set(SEEN) == {1}
    reads = [(x.kind, x.name, x.status) for x in history if x.kind == "get_event"]
    assert reads == [
        ("get_event", "stage of source", "completed"),
        ("get_event", "never of source", "timed_out"),
    ]


@durably.workflow(name="msg.late_reader")
async def late_reader(source: str) -> Any:
    return await durably.get_event(source, "stage", timeout=10)


async def test_get_event_waits_parked_for_a_value_published_later(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(late_reader, "src", workflow_id="late")  # no "src" yet
        await asyncio.wait_for(_until_status(e, "late", "waiting"), 10)
        # parked: no task is held for it (the task leaves a moment after its status shows)
        deadline = time.monotonic() + 5
        while "late" in e._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert "late" not in e._tasks
        source = await e.start(publisher, workflow_id="src")
        assert await handle.result(timeout=10) == 1
        await e.send_signal("src", "next")
        assert await source.result(timeout=10) == "published"
        (read,) = await e.history("late")
    assert (read.kind, read.status) == ("get_event", "completed")


@durably.workflow(name="msg.publish_once")
async def publish_once(value: int) -> str:
    durably.set_event("stage", value)
    await publish(value)
    return "published"


@durably.step
async def publish_from_step(value: int) -> int:
    durably.set_event("stage", value)  # published with this step's receipt
    return value


@durably.workflow(name="msg.publish_in_step")
async def publish_in_step(value: int) -> str:
    await publish_from_step(value)
    return "published"


@pytest.mark.parametrize("where", ["workflow", "step"])
@pytest.mark.parametrize("hold", [0.05, 30.0], ids=["parked", "held"])
async def test_a_reader_gets_an_event_as_it_is_published_not_at_its_next_read(
    store_url: str, hold: float, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``get_event`` wait reads again at a pause that grows with the wait (here 5 s):
    a publish wakes it at once, whether its run is parked (due now) or held (poked)."""
    monkeypatch.setattr(messages, "_POLL", (5.0, 5.0))
    async with durably.Engine(store_url, hold_seconds=hold, poll_interval=10) as e:
        handle = await e.start(late_reader, "src", workflow_id="late")
        await asyncio.wait_for(_read_waiting(e, "late"), 10)
        if hold < 1:
            await asyncio.wait_for(_until_status(e, "late", "waiting"), 10)
        await asyncio.sleep(0.3)  # well into its pause
        published = time.monotonic()
        await e.start(
            publish_once if where == "workflow" else publish_in_step, 7, workflow_id="src"
        )
        assert await handle.result(timeout=10) == 7
        waited = time.monotonic() - published
    assert waited < 2.5, f"read {waited:.1f} s after the publish: at its next read, not at once"


async def _read_waiting(e: durably.Engine, wid: str) -> None:
    """Return once the workflow's get_event wait is journaled (its first read found none)."""
    while not any(x.kind == "get_event" and x.status == "started" for x in await e.history(wid)):
        await asyncio.sleep(0.02)


# --- set_event from a step ------------------------------------------------------------------


@durably.step(retry=durably.Retry(max_attempts=2, initial=0.01))
async def progress(fail_first: bool) -> str:
    attempt = durably.step_info().attempt
    durably.set_event("progress", f"attempt {attempt}")
    durably.set_event("step seq", durably.step_info().seq)
    RAN.append(f"attempt {attempt}")
    if fail_first and attempt == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@durably.step
async def fails_after_setting() -> str:
    durably.set_event("doomed", "never published")
    raise RuntimeError("no")


@durably.workflow(name="msg.step_events")
async def step_events() -> str:
    await progress(True)
    with contextlib.suppress(RuntimeError):
        await fails_after_setting()
    SEEN.append("ran")
    await park()
    return "done"


async def test_set_event_in_a_step_is_published_with_its_receipt_only(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(step_events, workflow_id="step-events")
        assert await handle.result(timeout=10) == "done"
        assert await e.get_event("step-events", "progress") == "attempt 2"
        assert await e.get_event("step-events", "step seq") == 1
        with pytest.raises(TimeoutError):
            await e.get_event("step-events", "doomed")
        history = await e.history("step-events")
    assert RAN == ["attempt 1", "attempt 2"]  # the replay ran neither step again
    assert SEEN == ["ran", "ran"]
    assert [x.kind for x in history] == ["step", "step", "sleep"]  # no seq of their own


# --- helpers --------------------------------------------------------------------------------


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def _until_status(e: durably.Engine, workflow_id: str, status: str) -> None:
    while (await e.get_workflow(workflow_id)).status != status:
        await asyncio.sleep(0.02)
