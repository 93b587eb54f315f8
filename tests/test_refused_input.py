"""Values, names and numbers that cannot be stored are refused up front, clearly.

Issue 15 items 3 and 6, issue 13 items 4 and 7: a string that is not UTF-8 (a
lone surrogate, as ``os.listdir`` returns for a Latin-1 file name), a NUL in a
name, NaN or infinity as a duration. Each is refused at the call that was given
it, with an error naming what and where; a step's result that cannot be stored
fails the step like any other error; nothing is committed for a refused start.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import durably
from durably.agents import ModelRetry

LATIN1 = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # what os.listdir gives
NUL = "tool:refund\x00"
CALLS: collections.Counter[str] = collections.Counter()
NAN, INF = math.nan, math.inf


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


def with_engine(url: str, body: Callable[[durably.Engine], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        async with durably.Engine(url, hold_seconds=0.05, poll_interval=0.1, **options) as e:
            return await body(e)

    return asyncio.run(main())


# --- the workflows -------------------------------------------------------------------------


@durably.step
def list_dir() -> dict[str, Any]:
    CALLS["list_dir"] += 1
    return {"files": ["a.txt", "b.txt", "c.txt", LATIN1]}


@durably.step(retry=durably.Retry(max_attempts=3, initial=0.0, jitter=0.0))
def list_dir_retried() -> dict[str, Any]:
    CALLS["list_dir_retried"] += 1
    return {"files": ["a.txt", "b.txt", "c.txt", LATIN1]}


@durably.step
def open_latin1() -> None:
    CALLS["open_latin1"] += 1
    raise ValueError(f"cannot open {LATIN1}")


@durably.step
def effect() -> str:
    CALLS["effect"] += 1
    return "done"


def plain_effect() -> str:
    CALLS["effect"] += 1
    return "done"


@durably.workflow
async def lists_files(kind: str) -> Any:
    before = await effect()
    if kind == "plain":
        return [before, await list_dir()]
    if kind == "retried":
        return [before, await list_dir_retried()]
    await open_latin1()
    return before


@durably.workflow
async def bad_call(kind: str) -> Any:
    """Each kind makes one durable call with a name or duration that cannot be stored."""
    if kind == "step name":
        return await durably.run_step(effect, name=NUL)
    if kind == "step name (surrogate)":
        return await durably.run_step(plain_effect, name=LATIN1)
    if kind == "event key":
        durably.set_event("stage\x00x", 1)
    elif kind == "signal name":
        return await durably.wait_for_signal("go\x00")
    elif kind == "signal name (surrogate)":
        return await durably.wait_for_signal(LATIN1)
    elif kind == "child id":
        await durably.start_child(lists_files, "plain", workflow_id="child\x00")
    elif kind == "sleep(nan)":
        await durably.sleep(NAN)
    elif kind == "sleep(inf)":
        await durably.sleep(INF)
    elif kind == "sleep(-1)":
        await durably.sleep(-1)
    elif kind == "wait_for_signal(timeout=nan)":
        return await durably.wait_for_signal("go", timeout=NAN)
    elif kind == "wait_for_signal(timeout=inf)":
        return await durably.wait_for_signal("go", timeout=INF)
    return await effect()


# --- 15.3: a step result that is not UTF-8 ----------------------------------------------


def test_a_result_that_is_not_utf8_fails_the_step_once_naming_its_path(store_url: str) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(lists_files, "plain", workflow_id="wf-latin1")
        with pytest.raises(durably.EncodeError) as caught:
            await handle.result(timeout=20)
        return caught.value, *await asyncio.gather(
            engine.get_workflow("wf-latin1"), engine.history("wf-latin1")
        )

    error, info, history = with_engine(store_url, body, lease_seconds=2.0)
    message = str(error)
    assert "step 'list_dir'" in message and "result['files'][3]" in message, message
    assert "lone surrogate" in message, message
    assert info.status == "failed"
    assert info.crash_count == 0
    assert [(e.name, e.status) for e in history] == [
        ("effect", "completed"),
        ("list_dir", "failed"),
    ]
    assert dict(CALLS) == {"effect": 1, "list_dir": 1}


def test_a_result_that_is_not_utf8_follows_the_retry_policy(store_url: str) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(lists_files, "retried", workflow_id="wf-latin1-retried")
        with pytest.raises(durably.EncodeError, match=r"result\['files'\]\[3\]"):
            await handle.result(timeout=20)
        return await engine.history("wf-latin1-retried")

    history = with_engine(store_url, body)
    assert [(e.name, e.status, e.attempt) for e in history] == [
        ("effect", "completed", 1),
        ("list_dir_retried", "failed", 3),
    ]
    assert dict(CALLS) == {"effect": 1, "list_dir_retried": 3}


def test_an_error_message_that_is_not_utf8_is_recorded(store_url: str) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(lists_files, "error", workflow_id="wf-latin1-error")
        with pytest.raises(ValueError) as caught:
            await handle.result(timeout=20)
        return caught.value, await engine.get_workflow("wf-latin1-error")

    error, info = with_engine(store_url, body, lease_seconds=2.0)
    assert type(error) is ValueError
    assert str(error) == "cannot open caf\\udce9.txt"
    assert info.status == "failed"
    assert dict(CALLS) == {"effect": 1, "open_latin1": 1}


@pytest.mark.parametrize(
    ("start", "error", "fragment"),
    [
        ({"workflow_id": LATIN1}, durably.InvalidName, "workflow id 'caf\\udce9.txt'"),
        ({"workflow_id": "wf\x00"}, durably.InvalidName, "workflow id 'wf\\x00'"),
        ({"arg": LATIN1}, durably.EncodeError, "input['args'][0] is the string"),
        ({"kwarg": {"k": [LATIN1]}}, durably.EncodeError, "input['kwargs']['kind']['k'][0]"),
    ],
    ids=["id-surrogate", "id-nul", "arg", "kwarg"],
)
def test_start_refuses_what_cannot_be_stored_and_commits_nothing(
    store_url: str, start: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    async def body(engine: durably.Engine) -> Any:
        with pytest.raises(error) as caught:
            if "kwarg" in start:
                await engine.start(lists_files, kind=start["kwarg"], workflow_id="wf-k")
            else:
                wid = start.get("workflow_id", "wf-a")
                await engine.start(lists_files, start.get("arg", "plain"), workflow_id=wid)
        return caught.value, await engine.list_workflows()

    caught, rows = with_engine(store_url, body)
    assert fragment in str(caught), str(caught)
    assert rows == []
    with durably.Client(store_url) as client, pytest.raises(error) as again:
        if "kwarg" in start:
            client.start(lists_files, kind=start["kwarg"], workflow_id="wf-k")
        else:
            client.start(
                "lists_files", start.get("arg", "plain"), workflow_id=start.get("workflow_id")
            )
    assert fragment in str(again.value)
    with durably.Client(store_url) as client:
        assert client.list_workflows() == []
    assert CALLS == {}


# --- 13.4: names with a NUL or a lone surrogate ---------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("step name", "step name 'tool:refund\\x00'"),
        ("step name (surrogate)", "step name 'caf\\udce9.txt'"),
        ("event key", "event key 'stage\\x00x'"),
        ("signal name", "signal name 'go\\x00'"),
        ("signal name (surrogate)", "signal name 'caf\\udce9.txt'"),
        ("child id", "workflow id 'child\\x00'"),
    ],
)
def test_a_bad_name_in_a_workflow_fails_it_at_the_call(
    store_url: str, kind: str, fragment: str
) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(bad_call, kind, workflow_id="wf-bad")
        with pytest.raises(durably.InvalidName) as caught:
            await handle.result(timeout=20)
        return caught.value, await engine.get_workflow("wf-bad"), await engine.list_workflows()

    error, info, rows = with_engine(store_url, body, lease_seconds=2.0)
    assert fragment in str(error), str(error)
    assert info.status == "failed" and info.crash_count == 0
    assert [r.workflow_id for r in rows] == ["wf-bad"]  # no child was started
    assert CALLS == {}  # the step never ran


def test_a_bad_step_name_is_refused_at_decoration() -> None:
    with pytest.raises(durably.InvalidName, match=r"step name 'tool:refund\\x00'"):
        durably.step(name=NUL)
    with pytest.raises(durably.InvalidName, match="workflow name"):
        durably.workflow(name="flow\x00")
    with pytest.raises(durably.InvalidName, match="queue name"):
        durably.Queue("llm\x00")
    with pytest.raises(durably.InvalidName, match="queue name"):
        durably.Queue(LATIN1)


OPERATOR_CALLS: dict[str, Callable[[Any], Any]] = {
    "send_signal name": lambda c: c.send_signal("wf-ok", "go\x00", 1),
    "send_signal key": lambda c: c.send_signal("wf-ok", "go", 1, idempotency_key="k\x00"),
    "send_signal key (surrogate)": lambda c: c.send_signal("wf-ok", "go", idempotency_key=LATIN1),
    "send_signal id": lambda c: c.send_signal("wf\x00", "go", 1),
    "get_event key": lambda c: c.get_event("wf-ok", "k\x00"),
    "get_workflow id": lambda c: c.get_workflow("wf\x00"),
    "cancel id": lambda c: c.cancel(LATIN1),
    "resume id": lambda c: c.resume("wf\x00"),
    "fork new id": lambda c: c.fork("wf-ok", 1, "fork\x00"),
    "resolve by": lambda c: c.resolve("wf-ok", 1, retry=True, by="ann\x00"),
    "start name": lambda c: c.start("flow\x00"),
    "list name": lambda c: c.list_workflows(name="flow\x00"),
}


@pytest.mark.parametrize("call", sorted(OPERATOR_CALLS))
def test_a_bad_name_from_an_operator_is_refused_on_engine_and_client(
    store_url: str, call: str
) -> None:
    async def body(engine: durably.Engine) -> Any:
        return await (await engine.start(bad_call, "ok", workflow_id="wf-ok")).result(20)

    assert with_engine(store_url, body) == "done"  # a finished workflow to aim at
    before = _snapshot(store_url)
    with durably.Client(store_url) as client, pytest.raises(durably.InvalidName) as caught:
        OPERATOR_CALLS[call](client)
    assert "\\x00" in str(caught.value) or "\\udce9" in str(caught.value)

    async def engine_call(engine: durably.Engine) -> Any:
        with pytest.raises(durably.InvalidName):
            result = OPERATOR_CALLS[call](engine)
            if asyncio.iscoroutine(result):
                await result

    with_engine(store_url, engine_call)
    assert _snapshot(store_url) == before


def test_bad_queue_ids_are_refused_before_anything_is_committed(store_url: str) -> None:
    queue = durably.Queue("refused-q")

    async def body(engine: durably.Engine) -> Any:
        with pytest.raises(durably.InvalidName, match="deduplication_id"):
            await queue.enqueue(engine, lists_files, "plain", deduplication_id="d\x00")
        with pytest.raises(durably.InvalidName, match="workflow id"):
            await queue.enqueue(engine, lists_files, "plain", workflow_id=LATIN1)
        with pytest.raises(ValueError, match="priority"):
            await queue.enqueue(engine, lists_files, "plain", priority=2**63)
        return await engine.list_workflows()

    assert with_engine(store_url, body) == []
    with durably.Client(store_url) as client:
        with pytest.raises(durably.InvalidName, match="deduplication_id"):
            queue.enqueue_sync(client, "lists_files", "plain", deduplication_id=LATIN1)
        assert client.list_workflows() == []


def _snapshot(url: str) -> list[tuple[Any, ...]]:
    """Every workflow row, signal and journal entry: what a refused call must not change."""
    with durably.Client(url) as client:
        rows: list[tuple[Any, ...]] = []
        for info in client.list_workflows():
            rows.append((info.workflow_id, info.status, info.epoch))
            rows.extend((e.seq, e.name, e.status) for e in client.history(info.workflow_id))
            rows.extend(tuple(sorted(s.items())) for s in client.signals(info.workflow_id))
        return rows


# --- 13.7: NaN, infinity and wrong signs -----------------------------------------------------

_R = durably.Retry
_DE = durably.DefinitionError


def _engine(**options: Any) -> durably.Engine:
    return durably.Engine("sqlite:///never-created.db", **options)


def _tool(**options: Any) -> Any:
    return durably.tool(name="t", **options)(lambda: None)


_BAD_OPTIONS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("lease nan", lambda: _engine(lease_seconds=NAN), ValueError, "lease_seconds"),
    ("lease inf", lambda: _engine(lease_seconds=INF), ValueError, "lease_seconds"),
    ("lease 0", lambda: _engine(lease_seconds=0), ValueError, "lease_seconds"),
    ("poll nan", lambda: _engine(poll_interval=NAN), ValueError, "poll_interval"),
    ("poll inf", lambda: _engine(poll_interval=INF), ValueError, "poll_interval"),
    ("hold nan", lambda: _engine(hold_seconds=NAN), ValueError, "hold_seconds"),
    ("hold inf", lambda: _engine(hold_seconds=INF), ValueError, "hold_seconds"),
    ("hold -1", lambda: _engine(hold_seconds=-1), ValueError, "hold_seconds"),
    ("recoveries nan", lambda: _engine(max_recoveries=NAN), ValueError, "max_recoveries"),
    ("threads 0", lambda: _engine(step_threads=0), ValueError, "step_threads"),
    ("retry initial nan", lambda: _R(initial=NAN), _DE, "Retry(initial)"),
    ("retry initial inf", lambda: _R(initial=INF), _DE, "Retry(initial)"),
    ("retry backoff nan", lambda: _R(backoff=NAN), _DE, "Retry(backoff)"),
    ("retry backoff inf", lambda: _R(backoff=INF), _DE, "Retry(backoff)"),
    ("retry max_delay nan", lambda: _R(max_delay=NAN), _DE, "Retry(max_delay)"),
    ("retry max_delay inf", lambda: _R(max_delay=INF), _DE, "Retry(max_delay)"),
    ("retry jitter nan", lambda: _R(jitter=NAN), _DE, "Retry(jitter)"),
    ("retry attempts nan", lambda: _R(max_attempts=NAN), _DE, "Retry(max_attempts)"),  # type: ignore[arg-type]
    ("model retry nan", lambda: ModelRetry(max_retry_after=NAN), _DE, "max_retry_after"),
    ("step timeout nan", lambda: durably.step(timeout=NAN), _DE, "timeout"),
    ("step timeout inf", lambda: durably.step(timeout=INF), _DE, "timeout"),
    ("run_step timeout nan", lambda: durably.run_step(lambda: 1, timeout=NAN), _DE, "timeout"),
    ("tool timeout nan", lambda: _tool(timeout=NAN), _DE, "timeout"),
    ("approval nan", lambda: _tool(requires_approval=1, approval_timeout=NAN), _DE, "approval_"),
    ("approval inf", lambda: _tool(requires_approval=1, approval_timeout=INF), _DE, "approval_"),
    ("agent nan", lambda: durably.Agent(client=0, model="m", max_turns=NAN), _DE, "max_turns"),  # type: ignore[arg-type]
    ("queue per nan", lambda: durably.Queue("qn", rate_limit=(10, NAN)), _DE, "per_seconds"),
    ("queue per inf", lambda: durably.Queue("qi", rate_limit=(10, INF)), _DE, "per_seconds"),
    ("queue limit nan", lambda: durably.Queue("ql", rate_limit=(NAN, 1.0)), _DE, "limit"),  # type: ignore[arg-type]
    ("queue concurrency nan", lambda: durably.Queue("qc", concurrency=NAN), _DE, "concurrency"),  # type: ignore[arg-type]
    ("queue priority nan", lambda: durably.Queue("qp", priority=NAN), _DE, "priority"),  # type: ignore[arg-type]
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "error", "option"), [b[1:] for b in _BAD_OPTIONS], ids=[b[0] for b in _BAD_OPTIONS]
)
def test_a_number_that_is_not_finite_or_in_range_is_refused_naming_the_option(
    make: Callable[[], Any], error: type[Exception], option: str
) -> None:
    with pytest.raises(error) as caught:
        made = make()
        if asyncio.iscoroutine(made):
            made.close()
    assert option in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("kind", "option"),
    [
        ("sleep(nan)", "sleep(duration)=nan"),
        ("sleep(inf)", "sleep(duration)=inf"),
        ("sleep(-1)", "sleep(duration)=-1"),
        ("wait_for_signal(timeout=nan)", "wait_for_signal(timeout)=nan"),
        ("wait_for_signal(timeout=inf)", "wait_for_signal(timeout)=inf"),
    ],
)
def test_a_duration_that_is_not_finite_fails_the_workflow_at_the_call(
    sqlite_url: str, kind: str, option: str
) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(bad_call, kind, workflow_id="wf-nan")
        with pytest.raises(ValueError) as caught:
            await handle.result(timeout=20)
        return caught.value, await engine.history("wf-nan")

    error, history = with_engine(sqlite_url, body)
    assert option in str(error), str(error)
    assert history == []  # no timer or wait was journaled
    assert CALLS == {}


@pytest.mark.parametrize(
    "call",
    ["result(timeout=nan)", "get_event(timeout=nan)", "get_event(timeout=inf)", "close(nan)"],
)
def test_an_operator_timeout_that_is_not_finite_is_refused(sqlite_url: str, call: str) -> None:
    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(bad_call, "ok", workflow_id="wf-t")
        with pytest.raises(ValueError) as caught:
            if call == "result(timeout=nan)":
                await handle.result(timeout=NAN)
            elif call == "close(nan)":
                await engine.close(drain_timeout=NAN)
            else:
                await engine.get_event("wf-t", "k", timeout=NAN if "nan" in call else INF)
        return caught.value

    error = with_engine(sqlite_url, body)
    assert "timeout" in str(error), str(error)
    if call.startswith("get_event"):
        with durably.Client(sqlite_url) as client, pytest.raises(ValueError, match="timeout"):
            client.get_event("wf-t", "k", timeout=NAN)


def test_a_nan_delay_from_the_step_falls_back_to_the_usual_back_off() -> None:
    retry = durably.Retry(initial=5.0, jitter=0.0, delay_from=lambda exc: NAN)
    assert retry.delay_after(1, ValueError("429")) == 5.0
    retry = durably.Retry(max_delay=7.0, delay_from=lambda exc: INF)
    assert retry.delay_after(1, ValueError("429")) == 7.0
