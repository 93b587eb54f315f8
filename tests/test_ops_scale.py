"""Operations a DBOS user relies on: the current workflow's id, a retry predicate,
several signals in one transaction, and a per-workflow recovery limit; on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durably

SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


def engine(url: str, **kw: Any) -> durably.Engine:
    kw.setdefault("hold_seconds", 0.05)
    kw.setdefault("poll_interval", 0.1)
    return durably.Engine(url, **kw)


# --- durably.workflow_id() -------------------------------------------------------------


@durably.step
async def whose_async() -> str:
    return durably.workflow_id()


@durably.step
def whose_sync() -> str:
    return durably.workflow_id()


@durably.workflow(name="ops.whoami")
async def whoami() -> list[str]:
    return [durably.workflow_id(), await whose_async(), await whose_sync()]


async def test_workflow_id_is_readable_in_workflow_and_step_code(store_url: str) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(whoami, workflow_id="me-1")).result(timeout=10) == [
            "me-1",
            "me-1",
            "me-1",
        ]


def test_workflow_id_outside_a_workflow_says_so() -> None:
    with pytest.raises(durably.NotInWorkflow, match=r"durably\.workflow_id\(\)"):
        durably.workflow_id()


# --- Retry(should_retry=...) ---------------------------------------------------------------


class Transient(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


def server_side(exc: BaseException) -> bool:
    return isinstance(exc, Transient) and exc.code >= 500


@durably.step(retry=durably.Retry(max_attempts=5, initial=0.01, should_retry=server_side))
async def flaky(codes: list[int]) -> str:
    SEEN.append(codes[len(SEEN)])
    raise Transient(codes[len(SEEN) - 1])


@durably.workflow(name="ops.flaky")
async def call_flaky(codes: list[int]) -> str:
    try:
        return await flaky(codes)
    except Transient as exc:
        return f"gave up on {exc.code}"


async def test_should_retry_decides_which_errors_are_retried(store_url: str) -> None:
    async with engine(store_url) as e:
        result = await (await e.start(call_flaky, [503, 502, 404, 500])).result(timeout=10)
    assert result == "gave up on 404"
    assert SEEN == [503, 502, 404]  # retried twice, then the predicate said no


def test_should_retry_must_be_callable() -> None:
    with pytest.raises(durably.DefinitionError, match="should_retry"):
        durably.Retry(should_retry=3)  # type: ignore[arg-type]


# --- send_signals: one transaction -------------------------------------------------------


@durably.workflow(name="ops.listener")
async def listener(n: int) -> list[Any]:
    return [await durably.wait_for_signal("go") for _ in range(n)]


async def test_send_signals_commits_all_or_none(store_url: str) -> None:
    async with engine(store_url) as e:
        a = await e.start(listener, 2, workflow_id="la")
        b = await e.start(listener, 1, workflow_id="lb")
        sent = await e.send_signals([("la", "go", 1), ("lb", "go", "b"), ("la", "go", 2, "key-2")])
        assert sent == [True, True, True]
        assert await a.result(timeout=10) == [1, 2]
        assert await b.result(timeout=10) == ["b"]
        await e.start(listener, 1, workflow_id="lc")
        with pytest.raises(durably.WorkflowNotFound, match="nope"):
            await e.send_signals([("lc", "go", "kept?"), ("nope", "go", 1)])
        assert await e.signals("lc") == []  # the whole batch was refused
    with durably.Client(store_url) as client:
        assert client.send_signals([("lc", "go", "c", "k"), ("lc", "go", "c", "k")]) == [
            True,
            False,
        ]
        assert [s["payload"] for s in client.signals("lc")] == ['"c"']
        with pytest.raises(ValueError, match=r"signals\[0\]"):
            client.send_signals([("lc",)])  # type: ignore[list-item]


# --- max_recoveries per workflow ----------------------------------------------------------


class Vanish(BaseException):
    """Not an Exception: ends the workflow's task with no recorded outcome (a crash)."""


@durably.workflow(name="ops.fragile", max_recoveries=1)
async def fragile() -> None:
    SEEN.append("fragile")
    raise Vanish("gone")


@durably.workflow(name="ops.sturdy")
async def sturdy() -> None:
    SEEN.append("sturdy")
    raise Vanish("gone")


async def test_max_recoveries_per_workflow_from_decorator_and_start(store_url: str) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, ctx: None)  # the vanished tasks' reports
    async with engine(store_url, lease_seconds=1.0, max_recoveries=5) as e:
        by_decorator = await e.start(fragile, workflow_id="fr")
        with pytest.raises(durably.WorkflowFailed, match="crashed its executor 2 times"):
            await by_decorator.result(timeout=60)
        by_start = await e.start(sturdy, workflow_id="st", max_recoveries=0)
        with pytest.raises(durably.WorkflowFailed, match="crashed its executor 1 times"):
            await by_start.result(timeout=60)
        over_decorator = await e.start(fragile, workflow_id="fr0", max_recoveries=0)
        with pytest.raises(durably.WorkflowFailed, match="crashed its executor 1 times"):
            await over_decorator.result(timeout=60)
        assert (await e.get_workflow("st")).max_recoveries == 0
        assert (await e.get_workflow("fr")).max_recoveries == 1
    assert SEEN == ["fragile", "fragile", "sturdy", "fragile"]
    with durably.Client(store_url) as client:
        wid = client.start("ops.sturdy", workflow_id="by-name", max_recoveries=2)
        assert client.get_workflow(wid).max_recoveries == 2
        with pytest.raises(ValueError, match="max_recoveries"):
            client.start("ops.sturdy", max_recoveries=-1)


def test_max_recoveries_in_the_decorator_is_checked() -> None:
    with pytest.raises(durably.DefinitionError, match="max_recoveries"):

        @durably.workflow(name="ops.bad", max_recoveries=-2)
        async def bad() -> None: ...
