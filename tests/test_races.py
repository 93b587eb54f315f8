"""Deterministic waits in workflow code: ``durably.wait``, ``durably.wait_first``, and the
plain ``asyncio.wait`` race refused (issue 14, item 3).

durably replays a workflow after every park, so each test makes its workflow
park (a short ``hold_seconds`` and a durable sleep) after the race and checks
that the replay saw the same outcome as the first run. Every test runs on each
backend (``store_url``: SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import durably

RAN: list[str] = []  # one line per step invocation that started
SEEN: list[Any] = []  # what the workflow code saw right after the race, once per run


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    SEEN.clear()


def engine(url: str) -> durably.Engine:
    return durably.Engine(url, hold_seconds=0.05, poll_interval=0.2)


@durably.step
async def quick(label: str) -> str:
    RAN.append(label)
    await asyncio.sleep(0.05)
    return label


@durably.step
async def slow(label: str) -> str:
    RAN.append(label)
    await asyncio.sleep(0.6)
    RAN.append(f"{label} done")
    return label


class Broken(Exception):
    pass


@durably.step
async def breaks(label: str) -> str:
    RAN.append(label)
    await asyncio.sleep(0.05)
    raise Broken(label)


async def park(seconds: float = 0.3) -> None:
    """Let the run park (hold 0.05 s) and be replayed from its first line (a run parks
    only once no step of it is running: wait out a pending slow step first)."""
    await durably.sleep(seconds)


# --- the plain asyncio.wait --------------------------------------------------------------


@durably.workflow(name="races.plain")
async def plain_race() -> int:
    done, pending = await asyncio.wait(
        [asyncio.ensure_future(quick("a")), asyncio.ensure_future(slow("b"))],
        return_when=asyncio.FIRST_COMPLETED,
    )
    SEEN.append(len(done))
    await park()
    await asyncio.gather(*pending)
    return len(done)


async def test_plain_asyncio_wait_first_completed_is_refused_naming_durably_wait(
    store_url: str,
) -> None:
    # Unguarded, the first run saw 1 done and the replay after the park 2 (both steps
    # then return from the journal at once): the workflow took another path on replay.
    async with engine(store_url) as e:
        handle = await e.start(plain_race, workflow_id="plain")
        with pytest.raises(durably.NondeterministicWait, match=r"durably\.wait\(") as caught:
            await handle.result(timeout=10)
        assert "FIRST_COMPLETED" in str(caught.value)
        assert await handle.status() == "failed"
    assert SEEN == []


@durably.step
async def races_inside() -> int:
    done, _ = await asyncio.wait(
        [asyncio.ensure_future(asyncio.sleep(0.01)), asyncio.ensure_future(asyncio.sleep(5))],
        return_when=asyncio.FIRST_COMPLETED,
    )
    for task in _:
        task.cancel()
    return len(done)


@durably.workflow(name="races.in_step")
async def race_in_a_step() -> int:
    return await races_inside()


@durably.workflow(name="races.own_tasks")
async def race_of_own_tasks() -> int:
    # what agent frameworks do inside workflows: race their own tasks and queues
    quick_task = asyncio.ensure_future(asyncio.sleep(0.01))
    slow_task = asyncio.ensure_future(asyncio.sleep(5))
    done, _ = await asyncio.wait([quick_task, slow_task], return_when=asyncio.FIRST_COMPLETED)
    slow_task.cancel()
    return len(done)


async def test_plain_asyncio_wait_stays_allowed_over_no_durable_call_in_a_step_or_outside(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(race_in_a_step, workflow_id="in-step")).result(5) == 1
        assert await (await e.start(race_of_own_tasks, workflow_id="own")).result(5) == 1
        outside = asyncio.ensure_future(asyncio.sleep(5))
        done, pending = await asyncio.wait(
            [asyncio.ensure_future(asyncio.sleep(0)), outside],
            return_when=asyncio.FIRST_COMPLETED,
        )
        outside.cancel()
        assert (len(done), len(pending)) == (1, 1)


# --- wait_first ---------------------------------------------------------------------------


@durably.workflow(name="races.first")
async def first_wins() -> list[Any]:
    index, value = await durably.wait_first(slow("loser"), quick("winner"))
    SEEN.append((index, value))
    await park()
    return [index, value, await quick(f"after {index}")]


async def test_wait_first_returns_the_journaled_winner_after_a_park(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(first_wins, workflow_id="first")
        assert await handle.result(timeout=10) == [1, "winner", "after 1"]
        history = await e.history("first")
        claims = await e.claims("first")
    assert SEEN == [(1, "winner"), (1, "winner")]  # the first run, then the replay
    assert len(claims) == 2  # it really parked and was replayed
    # the loser was cancelled once the winner was known and never started again
    assert RAN == ["loser", "winner", "after 1"]
    wait = next(x for x in history if x.kind == "wait")
    assert (wait.name, wait.status, json.loads(wait.payload or "")) == (
        "wait_first",
        "completed",
        {"count": 2, "done": [1]},
    )
    assert [x.seq for x in history if x.kind == "step" and x.name.endswith("slow")] == []


@durably.workflow(name="races.first_raises")
async def first_raises() -> str:
    try:
        await durably.wait_first(slow("loser"), breaks("boom"))
    except Broken as exc:
        SEEN.append(str(exc))
    await park()
    return "handled"


async def test_wait_first_raises_the_winners_error_on_every_run(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(first_raises, workflow_id="first-raises")
        assert await handle.result(timeout=10) == "handled"
    assert SEEN == ["boom", "boom"]
    assert RAN == ["loser", "boom"]


@durably.workflow(name="races.signal_or_timer")
async def signal_or_timer() -> list[Any]:
    index, value = await durably.wait_first(durably.wait_for_signal("go"), durably.sleep(0.4))
    SEEN.append(index)
    await park()
    return [index, value]


async def test_wait_first_between_a_signal_and_a_timer_keeps_its_winner(store_url: str) -> None:
    async with engine(store_url) as e:
        timed = await e.start(signal_or_timer, workflow_id="timer-wins")
        assert await timed.result(timeout=10) == [1, None]
        signalled = await e.start(signal_or_timer, workflow_id="signal-wins")
        await e.send_signal("signal-wins", "go", "now")
        assert await signalled.result(timeout=10) == [0, "now"]
    assert sorted(SEEN) == [0, 0, 1, 1]


# --- what a losing signal wait took -----------------------------------------------------


@durably.workflow(name="races.two_signals")
async def two_signals() -> list[Any]:
    index, value = await durably.wait_first(
        durably.wait_for_signal("a"), durably.wait_for_signal("b")
    )
    SEEN.append((index, value))
    await park()
    return [index, value, await durably.wait_for_signal("b", timeout=1.0)]


@durably.workflow(name="races.timer_first")
async def timer_first() -> list[Any]:
    index, value = await durably.wait_first(durably.sleep(0), durably.wait_for_signal("go"))
    SEEN.append((index, value))
    await park()
    return [index, value, await durably.wait_for_signal("go", timeout=1.0)]


@pytest.mark.parametrize(
    ("workflow", "sent", "expected"),
    [
        (two_signals, {"a": "A", "b": "B"}, [0, "A", "B"]),
        (timer_first, {"go": "GO"}, [0, None, "GO"]),
    ],
    ids=["two-signals", "zero-sleep-first"],
)
async def test_a_signal_a_losing_wait_took_in_the_winners_instant_goes_to_the_next_wait(
    store_url: str, workflow: Any, sent: dict[str, str], expected: list[Any]
) -> None:
    # Both awaitables finish at once (their signals were sent before the race), so the
    # losing wait has taken its signal by the time the lower index wins: it must give it
    # back, for the later wait of that name, not drop it with its result.
    with durably.Client(store_url) as client:
        client.start(workflow, workflow_id="given-back")
        for name, payload in sent.items():
            client.send_signal("given-back", name, payload)
    async with engine(store_url) as e:
        assert await e.handle("given-back").result(timeout=10) == expected
        history = await e.history("given-back")
        assert len(await e.claims("given-back")) == 2  # it parked and was replayed
    with durably.Client(store_url) as client:
        signals = client.signals("given-back")
    assert len(SEEN) == 2 and SEEN[0] == SEEN[1] == tuple(expected[:2])  # first run, replay
    # each signal went to exactly one wait, which holds its payload; the loser's seq
    # holds nothing (a replay never starts it)
    received = {x.seq: x.payload for x in history if x.kind == "signal"}
    assert sorted(received.values()) == sorted(json.dumps(p) for p in sent.values())
    assert {s["consumed_seq"]: s["payload"] for s in signals} == received


@durably.workflow(name="races.wait_signals")
async def wait_signals() -> list[Any]:
    a = asyncio.ensure_future(durably.wait_for_signal("a"))
    b = asyncio.ensure_future(durably.wait_for_signal("b"))
    done, _ = await durably.wait([a, b], return_when=asyncio.FIRST_COMPLETED)
    SEEN.append(len(done))
    await park()
    return [await a, await b]


async def test_wait_first_completed_hands_every_signal_received_to_the_code(
    store_url: str,
) -> None:
    # durably.wait drops nothing: its done set holds every awaitable that finished, and
    # the pending ones keep running.
    with durably.Client(store_url) as client:
        client.start(wait_signals, workflow_id="wait-signals")
        client.send_signal("wait-signals", "a", "A")
        client.send_signal("wait-signals", "b", "B")
    async with engine(store_url) as e:
        assert await e.handle("wait-signals").result(timeout=10) == ["A", "B"]
    assert SEEN[0] == SEEN[1]


# --- wait with asyncio's shape -------------------------------------------------------------


@durably.workflow(name="races.wait")
async def wait_shape(return_when: str) -> list[Any]:
    fast_task = asyncio.ensure_future(quick("fast"))
    slow_task = asyncio.ensure_future(slow("slow"))
    done, pending = await durably.wait([slow_task, fast_task], return_when=return_when)
    SEEN.append((len(done), fast_task in done, slow_task in pending))
    await park(1.0)
    return [len(done), await slow_task]


async def test_wait_first_completed_returns_the_same_done_set_on_replay(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(wait_shape, asyncio.FIRST_COMPLETED, workflow_id="shape")
        assert await handle.result(timeout=10) == [1, "slow"]
        history = await e.history("shape")
        assert len(await e.claims("shape")) == 2  # it parked and was replayed
    # on the replay both steps return from the journal at once: asyncio.wait would say 2
    assert SEEN == [(1, True, True), (1, True, True)]
    assert sorted(RAN) == ["fast", "slow", "slow done"]  # pending work went on; none re-ran
    wait = next(x for x in history if x.kind == "wait")
    assert json.loads(wait.payload or "") == {"count": 2, "done": [1]}


@durably.workflow(name="races.wait_exception")
async def wait_for_an_error() -> list[Any]:
    failing = asyncio.ensure_future(breaks("bad"))
    slower = asyncio.ensure_future(slow("slow"))
    done, pending = await durably.wait([failing, slower], return_when=asyncio.FIRST_EXCEPTION)
    SEEN.append((failing in done, slower in pending, type(failing.exception()).__name__))
    await park(1.0)
    return [len(done), await slower]


async def test_wait_first_exception_returns_the_same_done_set_on_replay(store_url: str) -> None:
    async with engine(store_url) as e:
        handle = await e.start(wait_for_an_error, workflow_id="first-exc")
        assert await handle.result(timeout=10) == [1, "slow"]
    assert SEEN == [(True, True, "Broken"), (True, True, "Broken")]
    assert RAN == ["bad", "slow", "slow done"]


def test_wait_outside_a_workflow_names_the_call() -> None:
    pause = asyncio.sleep(0)
    with pytest.raises(durably.NotInWorkflow, match=r"durably\.wait_first\(\)"):
        durably.wait_first(pause)
    pause.close()


@durably.workflow(name="races.cancelled")
async def cancelled_race() -> Any:
    return await durably.wait_first(durably.wait_for_signal("never"), durably.sleep(30))


async def test_a_workflow_cancelled_while_parked_in_wait_first_ends_cancelled(
    store_url: str,
) -> None:
    async with engine(store_url) as e:
        handle = await e.start(cancelled_race, workflow_id="cancel-race")
        while (await handle.status()) != "waiting":
            await asyncio.sleep(0.02)
        await e.cancel("cancel-race")
        with pytest.raises(durably.Cancelled):
            await handle.result(timeout=10)
        assert await handle.status() == "cancelled"


BRANCHES = [0]  # plain (seq-less) awaitables races.changed adds (a test changes it mid-flight)


@durably.workflow(name="races.changed")
async def changed_race() -> int:
    plain = [asyncio.sleep(0) for _ in range(BRANCHES[0])]
    done, _ = await durably.wait([quick("a"), quick("b"), *plain])
    await durably.sleep(0.5)
    return len(done)


async def test_a_replay_waiting_on_another_number_of_awaitables_diverges(store_url: str) -> None:
    BRANCHES[0] = 0
    async with engine(store_url) as e:
        handle = await e.start(changed_race, workflow_id="changed")
        while (await handle.status()) != "sleeping":
            await asyncio.sleep(0.02)
        BRANCHES[0] = 1  # the code changed while it was parked: the seqs still line up
        with pytest.raises(durably.NonDeterminismError, match="over 2 awaitables"):
            await handle.result(timeout=10)
        assert await handle.status() == "diverged"
