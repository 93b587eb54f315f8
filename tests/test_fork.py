"""Forks carry what their copied prefix recorded: events, child links, usage, and where
they came from (``forked_from``), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably import cli

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def engine(url: str, **kw: Any) -> durably.Engine:
    kw.setdefault("hold_seconds", 0.05)
    kw.setdefault("poll_interval", 0.2)
    return durably.Engine(url, **kw)


@durably.step
async def s(text: str) -> str:
    RAN.append(text)
    return text


@durably.workflow(name="fork.publisher")
async def publisher() -> str:
    durably.set_event("k", 1)  # seq 1
    await s("a")  # seq 2
    durably.set_event("k", 2)  # seq 3
    durably.set_event("late", "x")  # seq 4
    return await s("b")  # seq 5


@durably.workflow(name="fork.kid")
async def kid(n: int) -> int:
    RAN.append(f"kid {n}")
    return n * 10


@durably.workflow(name="fork.parent")
async def parent() -> int:
    child = await durably.start_child(kid, 4, workflow_id="fork-kid")  # seq 1
    got = await child.result()  # seq 2
    return int(await s(str(got))) + 1  # seq 3


async def test_a_fork_carries_the_events_of_its_prefix(store_url: str) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(publisher, workflow_id="pub")).result(timeout=10) == "b"
        # The prefix (seq 1..2, as in set_event; await s()) is copied: k was 1 there.
        fork = await e.fork("pub", from_seq=2, workflow_id_new="pub-fork")
        assert await fork.result(timeout=10) == "b"
        assert RAN == ["a", "b", "b"]  # the fork ran only what follows its prefix
        assert await e.get_event("pub-fork", "k", timeout=5) == 2
        assert await e.get_event("pub-fork", "late", timeout=5) == "x"
    with durably.Client(store_url) as client:
        early = client.fork("pub", 1, "pub-early")
        assert client.get_event(early, "k") == 1  # published before it ever runs
        with pytest.raises(TimeoutError):
            client.get_event(early, "late", timeout=0)


async def test_the_fork_event_is_the_prefix_value_not_the_latest(store_url: str) -> None:
    async with engine(store_url) as e:
        await (await e.start(publisher, workflow_id="pub")).result(timeout=10)
    with durably.Client(store_url) as client:
        assert client.get_event("pub", "k") == 2
        client.fork("pub", 2, "pub-2")
        assert client.get_event("pub-2", "k") == 1  # not 2, published after the prefix
        client.fork("pub", 3, "pub-3")
        assert client.get_event("pub-3", "k") == 2
        assert client.get_event("pub", "late") == "x"  # the original keeps its own


async def test_a_fork_records_where_it_came_from(store_url: str) -> None:
    async with engine(store_url) as e:
        await (await e.start(publisher, workflow_id="pub")).result(timeout=10)
        await e.fork("pub", from_seq=3, workflow_id_new="pub-f")
        info = await e.get_workflow("pub-f")
        original = await e.get_workflow("pub")
    assert (info.forked_from, info.forked_from_seq) == ("pub", 3)
    assert (original.forked_from, original.forked_from_seq) == (None, None)
    shown = CliRunner().invoke(cli.main, ["--database", store_url, "show", "pub-f", "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert document["workflow"]["forked_from"] == "pub"
    assert document["workflow"]["forked_from_seq"] == 3
    text = CliRunner().invoke(cli.main, ["--database", store_url, "show", "pub-f"])
    assert "forked from pub at seq 3" in text.output


async def test_a_fork_after_a_child_started_joins_that_child(store_url: str) -> None:
    async with engine(store_url) as e:
        assert await (await e.start(parent, workflow_id="par")).result(timeout=10) == 41
        assert RAN == ["kid 4", "40"]
        fork = await e.fork("par", from_seq=2, workflow_id_new="par-f")
        assert await fork.result(timeout=10) == 41
        kids = [w.workflow_id for w in await e.list_workflows(name="fork.kid")]
        history = await e.history("par-f")
    assert RAN == ["kid 4", "40", "40"]  # the child ran once; only the step after the prefix
    assert kids == ["fork-kid"]
    assert [(x.kind, x.name) for x in history][:2] == [("child", "fork.kid"), ("join", "fork-kid")]


async def test_forked_from_travels_in_archives_and_older_archives_still_import(
    store_url: str, tmp_path: Any
) -> None:
    async with engine(store_url) as e:
        await (await e.start(publisher, workflow_id="pub")).result(timeout=10)
    with durably.Client(store_url) as client:
        client.fork("pub", 2, "pub-f")
    exported = CliRunner().invoke(cli.main, ["--database", store_url, "export"])
    assert exported.exit_code == 0, exported.output
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    new = tmp_path / "new.jsonl"
    new.write_text(exported.stdout)
    for line in lines:  # as written by a durably from before forks were recorded
        if "workflow" in line:
            del line["workflow"]["forked_from"], line["workflow"]["forked_from_seq"]
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for name, path, expected in (("a", new, ("pub", 2)), ("b", old, (None, None))):
        target = f"sqlite:///{tmp_path / name}.db"
        imported = CliRunner().invoke(cli.main, ["--database", target, "import", str(path)])
        assert imported.exit_code == 0, imported.output
        with durably.Client(target) as client:
            info = client.get_workflow("pub-f")
            assert (info.forked_from, info.forked_from_seq) == expected
            assert client.get_event("pub-f", "k") == 1


# --- a prefix that ends in a step whose outcome is open -----------------------------------

HANG: dict[str, Any] = {}


@durably.step(at_most_once=True)
async def ship(order: str) -> str:
    RAN.append(f"ship {durably.idempotency_key()}")
    if "hang" in HANG:
        await HANG["hang"].wait()
    return f"shipped {order}"


@durably.workflow(name="fork.shipper")
async def shipper(order: str) -> str:
    await s(order)  # seq 1
    return await ship(order)  # seq 2: an intent, then the call


@durably.step(retry=durably.Retry(max_attempts=3, initial=3600.0))
async def flaky() -> None:
    RAN.append("flaky")
    raise RuntimeError("down")


@durably.workflow(name="fork.flaky")
async def flaky_flow() -> None:
    await s("x")  # seq 1
    await flaky()  # seq 2: attempt 1 fails, attempt 2 is due in an hour


async def _ship_cut_inside_the_call(url: str) -> None:
    """Start fork.shipper and stop its engine hard while ``ship`` runs: seq 2 is an
    intent without its receipt, the call's outcome unknown."""
    HANG["hang"] = asyncio.Event()
    e = engine(url)
    await e.open()
    try:
        await e.start(shipper, "O-1", workflow_id="ship")
        while not any(r.startswith("ship") for r in RAN):
            await asyncio.sleep(0.01)
    finally:
        await e.close(drain_timeout=0.05)
        del HANG["hang"]


async def test_a_fork_refuses_to_copy_a_step_whose_outcome_is_unknown(store_url: str) -> None:
    """The intent's key is ``ship:2``; in the fork the step's key would be the fork's:
    reconcile would look up a key never sent, an at-most-once step would park for a call
    the fork never made. The fork is refused at and past that seq, naming it; from before
    it, it runs the step anew under its own key; once decided, the decision is copied."""
    await _ship_cut_inside_the_call(store_url)
    with durably.Client(store_url) as client:
        assert [(x.seq, x.status) for x in client.history("ship")] == [
            (1, "completed"),
            (2, "started"),
        ]
        for from_seq in (2, 9):
            with pytest.raises(durably.DurablyError) as refused:
                client.fork("ship", from_seq, f"ship-{from_seq}")
            assert type(refused.value).__name__ == "NotForkable", refused.value
            said = str(refused.value)
            assert "step 'ship' at seq 2" in said and "outcome is unknown" in said, said
            assert "from_seq=1" in said, said
            with pytest.raises(durably.WorkflowNotFound):  # nothing was created
                client.get_workflow(f"ship-{from_seq}")
    async with engine(store_url) as e:
        await until_status(e, "ship", "needs_review")
        with pytest.raises(durably.errors.NotForkable):  # parked for review: still unknown
            await e.fork("ship", from_seq=2, workflow_id_new="ship-2")
        anew = await e.fork("ship", from_seq=1, workflow_id_new="ship-1")
        assert await anew.result(timeout=10) == "shipped O-1"
        await e.resolve("ship", 2, result="shipped by hand", by="ops")
        assert await e.handle("ship").result(timeout=10) == "shipped by hand"
        decided = await e.fork("ship", from_seq=2, workflow_id_new="ship-2")
        assert await decided.result(timeout=10) == "shipped by hand"
    assert RAN == ["O-1", "ship ship:2", "ship ship-1:2"]  # never under ship-2's key


async def test_a_fork_refuses_to_copy_a_step_between_its_retries(store_url: str) -> None:
    """A failed attempt whose retry is to come: in the fork the next attempt would run
    under the fork's key, not the one the failed attempts sent."""
    async with engine(store_url) as e:
        await e.start(flaky_flow, workflow_id="fl")
        await until_status(e, "fl", "sleeping")
        with pytest.raises(durably.DurablyError, match=r"step 'flaky' at seq 2 .*retry") as no:
            await e.fork("fl", from_seq=2, workflow_id_new="fl-2")
        assert type(no.value).__name__ == "NotForkable", no.value
        fork = await e.fork("fl", from_seq=1, workflow_id_new="fl-1")
        await until_status(e, "fl-1", "sleeping")
        history = await e.history("fl-1")
    assert [(x.seq, x.status, x.attempt) for x in history] == [
        (1, "completed", 1),
        (2, "retrying", 1),
    ]
    assert fork.workflow_id == "fl-1" and RAN == ["x", "flaky", "flaky"]


async def until_status(e: durably.Engine, wid: str, status: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (now := await e.handle(wid).status()) != status:
        assert loop.time() < deadline, f"{wid} still {now}, not {status}"
        await asyncio.sleep(0.02)
