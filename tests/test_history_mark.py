"""A workflow's history mark (``Client.history_mark``): what the dashboard's stream reads
every half second instead of the whole journal. It is exact, since a final entry never
changes (the count, the last seq and the open entries are what history can differ by),
and its cost is the journal's index entries, not its rows with their payloads."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import journal
from durably.server import api
from durably.storage import create_store

GATES: dict[str, asyncio.Event] = {}
CALLS: collections.Counter[str] = collections.Counter()
VERSIONS: dict[str, str] = {}


@durably.step(at_most_once=True)
async def refund(gate: str) -> str:
    """An effect whose intent is journaled first: open until its gate is set."""
    await GATES[gate].wait()
    return f"refunded after {gate}"


@durably.step
async def lookup(i: int) -> int:
    return i * i


@durably.step(retry=durably.Retry(max_attempts=2, initial=1.5, jitter=0))
async def flaky() -> str:
    CALLS["flaky"] += 1
    if CALLS["flaky"] == 1:
        raise RuntimeError("the first attempt fails")
    return "second time lucky"


@durably.workflow
async def long_agent(lookups: int) -> str:
    await asyncio.gather(refund("first"), refund("second"), *(lookup(i) for i in range(lookups)))
    await flaky()
    said = await durably.wait_for_signal("go")
    return f"{said}"


def derived(client: durably.Client, wid: str) -> journal.HistoryMark:
    """The mark as the whole history and signals say it should be."""
    entries = client.history(wid)
    return journal.HistoryMark(
        entries=len(entries),
        last_seq=max((e.seq for e in entries), default=None),
        open=tuple(
            (e.seq, e.status, e.attempt) for e in entries if e.status in journal.OPEN_ENTRY_STATUSES
        ),
        signals=len(client.signals(wid)),
    )


async def settled(
    client: durably.Client, wid: str, ready: Any, what: str
) -> tuple[journal.HistoryMark, list[journal.Entry]]:
    """Wait (letting the engine run) until ``ready(history)``, then the mark, checked
    against the history read on both sides of it (no write between them)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        before = client.history(wid)
        if ready(before):
            mark = client.history_mark(wid)
            version = api.version(client, wid)  # what the dashboard's stream sends
            if client.history(wid) == before:
                assert mark == derived(client, wid), what
                VERSIONS[what] = version
                return mark, before
        await asyncio.sleep(0.01)
    raise AssertionError(f"never reached: {what}; history {client.history(wid)}")


def _statuses(entries: list[journal.Entry], name: str) -> list[str]:
    return [e.status for e in entries if e.name == name]


async def test_the_mark_is_the_history_s_and_moves_with_every_change_it_shows(
    store_url: str,
) -> None:
    GATES.clear()
    GATES.update(first=asyncio.Event(), second=asyncio.Event())
    CALLS.clear()
    VERSIONS.clear()
    client = durably.Client(store_url)
    async with durably.Engine(store_url, poll_interval=0.05) as engine:
        handle = await engine.start(long_agent, 30, workflow_id="long-agent")
        wid = handle.workflow_id
        marks: dict[str, journal.HistoryMark] = {}

        marks["two intents open"], seen = await settled(
            client,
            wid,
            lambda h: len(h) == 32 and _statuses(h, "lookup").count("completed") == 30,
            "both refunds' intents and the 30 lookups",
        )
        opened = marks["two intents open"].open
        assert [status for _, status, _ in opened] == ["started", "started"]
        assert marks["two intents open"].last_seq == max(e.seq for e in seen)

        # only an old entry changes: the count and the last seq stay, the open ones move
        GATES["first"].set()
        marks["one intent open"], _ = await settled(
            client,
            wid,
            lambda h: sorted(_statuses(h, "refund")) == ["completed", "started"],
            "the first refund's receipt, the second's intent still open",
        )
        one, two = marks["one intent open"], marks["two intents open"]
        assert (one.entries, one.last_seq) == (two.entries, two.last_seq)
        assert len(one.open) == 1 and one != two

        GATES["second"].set()
        marks["retrying"], _ = await settled(
            client,
            wid,
            lambda h: _statuses(h, "flaky") == ["retrying"],
            "the flaky step's first attempt failed, its retry due",
        )
        ((_, status, attempt),) = marks["retrying"].open
        assert (status, attempt) == ("retrying", 1)

        marks["waiting for a signal"], _ = await settled(
            client,
            wid,
            lambda h: _statuses(h, "flaky") == ["completed"] and len(h) > 33,
            "the retry's receipt and the wait for the signal",
        )
        await engine.send_signal(wid, "go", "ahead")
        assert await handle.result(timeout=30) == "ahead"
        marks["finished"], _ = await settled(client, wid, lambda h: True, "the end")
        assert marks["finished"].signals == 1 and marks["finished"].open == ()

        # every state the page would show differently has a mark of its own
        assert len(set(marks.values())) == len(marks), marks
        # and the workflow page's stream sends a new version at each (its reload shows it)
        assert len(set(VERSIONS.values())) == len(VERSIONS) == len(marks), VERSIONS
    with pytest.raises(durably.WorkflowNotFound):
        client.history("nobody")
    assert client.history_mark("nobody") == journal.HistoryMark(0, None, (), 0)
    with pytest.raises(durably.InvalidName):
        client.history_mark("a\x00b")
    client.close()


def test_the_index_holds_the_open_statuses_journal_defines() -> None:
    """The migration's partial index and history_mark's query name the open statuses as
    journal.OPEN_ENTRY_STATUSES says (test_queries checks the query's list)."""
    migration = Path(durably.__file__).parent / "storage" / "migrations" / "0012_open_entries.sql"
    (listed,) = re.findall(r"WHERE status IN \(([^)]*)\)", migration.read_text())
    assert {v.strip().strip("'") for v in listed.split(",")} == set(journal.OPEN_ENTRY_STATUSES)


def _plan(store: Any, postgres: bool, query: str) -> str:
    """How the database reads one of the store's queries for the long workflow."""
    params = {"workflow_id": "long"}
    if postgres:
        sql = "EXPLAIN (ANALYZE, FORMAT TEXT) " + store._queries[query]
    else:
        sql = "EXPLAIN QUERY PLAN " + store._queries[query]
    return "\n".join(str(row[-1]) for row in store._execute(sql, params).fetchall())


def test_the_mark_of_a_long_journal_reads_indexes_never_the_entries_rows(
    store_url: str,
) -> None:
    """A long agent's 5,000 entries of 1.5 KB results among 45,000 of other workflows, one
    intent open: the mark reads the primary key's entries (on SQLite a covering read) and
    the open entries' partial index, not the payloads, and sends three rows."""
    postgres = store_url.startswith("postgres")
    store: Any = create_store(store_url)
    store.open()
    try:
        numbers = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) "
        store._execute(
            numbers.format(n=451)
            + "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
            "SELECT CASE WHEN i = 451 THEN 'long' ELSE 'other-' || CAST(i AS TEXT) END, "
            "'agent', 'running', '[]', i, i FROM n",
            {},
        )
        # 1,500 characters no database compresses away (PostgreSQL keeps them in the row)
        big = (
            "(SELECT string_agg(md5(CAST(random() AS TEXT) || CAST(g AS TEXT)), '') "
            "FROM generate_series(1, 47) g)"
            if postgres
            else "hex(randomblob(750))"
        )
        entry = (
            "INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, "
            "started_at, finished_at) SELECT {wid}, {seq}, 'step', 'model', {status}, 1, "
            "{payload}, i, i FROM n"
        )
        store._execute(
            numbers.format(n=45_000)
            + entry.format(
                wid="'other-' || CAST(i - 450 * ((i - 1) / 450) AS TEXT)",
                seq="i",
                status="'completed'",
                payload="'\"short\"'",
            ),
            {},
        )
        store._execute(
            numbers.format(n=5_000)
            + entry.format(
                wid="'long'",
                seq="i",
                status="CASE WHEN i = 777 THEN 'started' ELSE 'completed' END",
                payload=big,
            ),
            {},
        )
        store._execute("VACUUM ANALYZE" if postgres else "VACUUM", {})  # as autovacuum would
        mark = store.history_mark("long")
        assert mark == journal.HistoryMark(5_000, 5_000, ((777, "started", 1),), 0)
        plan = _plan(store, postgres, "history_mark")
        if postgres:
            # index-only where the visibility map allows (pages autovacuum has been to; a
            # transaction open elsewhere holds it back), else the rows' pages, never TOAST
            assert "journal_pkey" in plan, plan
            assert "journal_open" in plan and "Seq Scan on journal" not in plan, plan
        else:
            assert "USING COVERING INDEX sqlite_autoindex_journal_1" in plan, plan
            assert "USING INDEX journal_open" in plan, plan
            assert re.search(r"SCAN journal\b(?! USING)", plan) is None, plan
        whole = _plan(store, postgres, "load_history")  # the look before: every row
        assert "Index Only" not in whole and "COVERING" not in whole, whole
        assert (
            len(store._execute(store._queries["history_mark"], {"workflow_id": "long"}).fetchall())
            == 3
        )
    finally:
        store.close()
