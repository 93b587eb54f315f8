"""The engine in one process: steps, retries, replay, journaled values, suspension.

Every test runs on each backend (``store_url``: SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import durably

CALLS: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


@durably.step
async def add(a: int, b: int) -> int:
    CALLS.append(("add", durably.idempotency_key()))
    return a + b


@durably.step
def double(x: int) -> int:
    CALLS.append(("double", durably.step_info().attempt))
    return x * 2


@durably.workflow
async def arithmetic(n: int) -> dict[str, int]:
    a = await add(n, 1)
    b = await double(a)
    return {"a": a, "b": b}


class Flaky(Exception):
    pass


@durably.step(retry=durably.Retry(max_attempts=3, initial=0.01, jitter=0))
def flaky(fail_times: int) -> str:
    attempt = durably.step_info().attempt
    CALLS.append(("flaky", attempt))
    if attempt <= fail_times:
        raise Flaky(f"attempt {attempt} failed")
    return f"ok after {attempt}"


@durably.workflow
async def flaky_flow(fail_times: int) -> str:
    return await flaky(fail_times)


async def test_workflow_completes_and_journals_each_step(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(arithmetic, 4, workflow_id="wf-1")
        assert await handle.result() == {"a": 5, "b": 10}
        assert await handle.status() == "completed"
        history = await engine.history("wf-1")
    assert [(e.seq, e.name, e.status, e.payload) for e in history] == [
        (1, "add", "completed", "5"),
        (2, "double", "completed", "10"),
    ]
    assert CALLS == [("add", "wf-1:1"), ("double", 1)]


async def test_start_is_idempotent_on_workflow_id(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        first = await engine.start(arithmetic, 1, workflow_id="same")
        second = await engine.start(arithmetic, 99, workflow_id="same")
        assert await first.result() == await second.result() == {"a": 2, "b": 4}
        third = await engine.start(arithmetic, 99, workflow_id="same")
        assert await third.result() == {"a": 2, "b": 4}
    assert [c[0] for c in CALLS] == ["add", "double"]


async def test_start_commits_before_returning(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        await engine.start(arithmetic, 1, workflow_id="committed")
        # Read it through another connection before the workflow has run.
        with durably.Client(store_url) as client:
            row = client.get_workflow("committed")
        assert (row.name, row.input) == ("arithmetic", '{"args":[1],"kwargs":{}}')
        await engine.handle("committed").result()


def test_run_is_a_sync_one_liner(store_url: str) -> None:
    assert durably.run(arithmetic, 2, workflow_id="r", database=store_url) == {"a": 3, "b": 6}
    # Running again returns the recorded result without running a step.
    assert durably.run(arithmetic, 2, workflow_id="r", database=store_url) == {"a": 3, "b": 6}
    assert len(CALLS) == 2


async def test_retry_records_attempts_and_succeeds(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(flaky_flow, 2, workflow_id="f")
        assert await handle.result() == "ok after 3"
        (entry,) = await engine.history("f")
    assert CALLS == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert (entry.status, entry.attempt) == ("completed", 3)


async def test_exhausted_retries_reraise_the_original_type_on_every_replay(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(flaky_flow, 5, workflow_id="f")
        with pytest.raises(Flaky, match="attempt 3 failed"):
            await handle.result()
        (entry,) = await engine.history("f")
        assert (entry.status, entry.attempt) == ("failed", 3)
    async with durably.Engine(store_url) as engine:
        with pytest.raises(Flaky, match="attempt 3 failed"):
            await engine.handle("f").result()
    assert len(CALLS) == 3


class Unbuildable(Exception):
    def __init__(self, a: int, b: int, c: int) -> None:
        super().__init__(f"{a}-{b}-{c}")
        self.abc = (a, b, c)


@durably.step
async def raises_unbuildable() -> None:
    raise Unbuildable(1, 2, 3)


@durably.workflow
async def catches() -> str:
    try:
        await raises_unbuildable()
    except Exception as exc:  # recorded error comes back as the original type
        return type(exc).__name__
    return "no error"


async def test_step_error_is_catchable_in_the_workflow(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        assert await (await engine.start(catches, workflow_id="c")).result() == "Unbuildable"


@durably.step(timeout=0.05, retry=durably.Retry(max_attempts=2, initial=0.0, jitter=0))
async def slow_step() -> str:
    CALLS.append(("slow", durably.step_info().attempt))
    await asyncio.sleep(5)
    return "never"


@durably.workflow
async def slow_flow() -> str:
    return await slow_step()


async def test_step_timeout_fails_the_attempt(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        with pytest.raises(durably.StepTimeout, match=r"slow_step.*timeout of 0\.05s"):
            await (await engine.start(slow_flow, workflow_id="t")).result()
    assert CALLS == [("slow", 1), ("slow", 2)]


@durably.step
async def sleepy(name: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    CALLS.append(("sleepy", name))
    return name


@durably.workflow
async def fan_out() -> list[str]:
    return list(await asyncio.gather(sleepy("a", 0.15), sleepy("b", 0.05), sleepy("c", 0.0)))


async def test_gather_takes_seqs_in_call_order_whatever_finishes_first(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        assert await (await engine.start(fan_out, workflow_id="g")).result() == ["a", "b", "c"]
        history = await engine.history("g")
    assert [c[1] for c in CALLS] == ["c", "b", "a"]
    assert [(e.seq, e.payload) for e in history] == [(1, '"a"'), (2, '"b"'), (3, '"c"')]


GATE: dict[str, asyncio.Event] = {}


@durably.step
async def wait_for_gate(name: str) -> str:
    CALLS.append(("gate", name))
    await GATE[name].wait()
    return name


@durably.workflow
async def values_then_gate() -> dict[str, Any]:
    t = durably.now()
    r = durably.random()
    u = durably.uuid4()
    first = await wait_for_gate("one")
    second = await wait_for_gate("two")
    return {"t": t, "r": r, "u": u, "first": first, "second": second}


async def until(done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for a condition; fail, naming it, when it is not reached in ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not reached in {timeout}s"
        await asyncio.sleep(0.005)


async def test_close_lets_the_running_step_finish_then_a_new_engine_replays(
    store_url: str,
) -> None:
    GATE.clear()
    GATE["one"], GATE["two"] = asyncio.Event(), asyncio.Event()
    engine = durably.Engine(store_url)
    await engine.open()
    await engine.start(values_then_gate, workflow_id="v")
    await until(lambda: ("gate", "one") in CALLS, "the step to start")
    closing = asyncio.create_task(engine.close())
    services = engine._services
    assert services is not None
    await until(services.stopping.is_set, "close to begin")
    assert not closing.done()  # it waits for the running step
    with durably.Client(store_url) as client:  # the lease is kept while the step runs
        assert client.get_workflow("v").owner == engine.executor_id
    assert not closing.done()
    GATE["one"].set()
    await asyncio.wait_for(closing, timeout=30)
    # the proof that close waited: the step's result was committed before the store closed
    client = durably.Client(store_url)
    info = client.get_workflow("v")
    assert (info.status, info.owner) == ("running", None)  # released, not failed
    recorded = client.history("v")
    client.close()
    assert [e.kind for e in recorded] == ["now", "random", "uuid4", "step"]
    GATE["two"].set()
    async with durably.Engine(store_url) as engine:
        result = await engine.handle("v").result()
    assert CALLS == [("gate", "one"), ("gate", "two")]  # step one did not run again
    assert result["t"].isoformat() in (recorded[0].payload or "")
    assert repr(result["r"]) in (recorded[1].payload or "")
    assert isinstance(result["u"], uuid.UUID) and result["u"].hex in (recorded[2].payload or "")


async def test_unknown_names_and_bad_definitions_fail_early(store_url: str) -> None:
    with pytest.raises(durably.DefinitionError, match="async def"):
        durably.workflow(lambda: None)
    with pytest.raises(durably.DefinitionError, match="generator"):

        @durably.step
        def gen() -> Any:
            yield 1

    with pytest.raises(durably.DefinitionError, match="max_attempts"):
        durably.Retry(max_attempts=0)
    with pytest.raises(durably.NotInWorkflow, match="now"):
        durably.now()
    with pytest.raises(durably.NotInWorkflow):
        durably.idempotency_key()
    async with durably.Engine(store_url) as engine:
        with pytest.raises(durably.WorkflowNotRegistered, match="nope"):
            await engine.start("nope")


@durably.step
def plain_double(x: int) -> int:
    return x * 2


async def test_steps_called_outside_a_workflow_run_plainly() -> None:
    assert await plain_double(21) == 42


# A step never runs before the journaled values it can observe are durable, even when
# another step of the same gather is the one committing them (found by
# test_property_crashes: a kill between the two made the next run draw new values, and a
# step ran again on other inputs under the same idempotency key).
READER: dict[str, durably.Client] = {}


@durably.step
async def finds_the_value_committed(wid: str, value: float, n: int) -> bool:
    kinds = [entry.kind for entry in READER["client"].history(wid)]  # another connection
    return "random" in kinds


@durably.workflow(name="engine.gather_after_random")
async def gather_after_random() -> list[bool]:
    value, wid = durably.random(), durably.workflow_id()
    steps = (finds_the_value_committed(wid, value, n) for n in range(3))
    return list(await asyncio.gather(*steps))


async def test_no_step_of_a_gather_runs_before_the_values_it_sees_are_committed(
    store_url: str,
) -> None:
    with durably.Client(store_url) as client:
        READER["client"] = client
        async with durably.Engine(store_url) as engine:
            handles = [await engine.start(gather_after_random) for _ in range(8)]
            found = [await h.result(timeout=30) for h in handles]
    assert found == [[True, True, True]] * 8
