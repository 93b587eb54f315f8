"""queries.sql kept honest: each query described and used, statuses as journal.py defines
them, and rows read by column name (a reordered column shifts no field), on both backends."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from durably import journal
from durably.storage import base, claims, create_store, sqlbase

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "durably"
QUERIES = (SRC / "storage" / "queries.sql").read_text(encoding="utf-8")
NOW = 1_000_000.0

#: Every status set a query may spell out, by the name journal.py gives it.
NAMED_SETS = {
    "FINISHED_STATUSES": frozenset(journal.FINISHED_STATUSES),
    "LIVE_STATUSES": frozenset(s.value for s in journal.LIVE_STATUSES),
    "PARKED_STATUSES": frozenset(s.value for s in journal.PARKED_STATUSES),
    "MESSAGED_STATUSES": frozenset(s.value for s in journal.MESSAGED_STATUSES),
    "TIMED_STATUSES": frozenset(s.value for s in journal.TIMED_STATUSES),
    "UNFINISHED_STATUSES": frozenset(s.value for s in journal.UNFINISHED_STATUSES),
    "FINAL_ENTRY_STATUSES": frozenset(s.value for s in journal.FINAL_ENTRY_STATUSES),
    "OPEN_ENTRY_STATUSES": frozenset(s.value for s in journal.OPEN_ENTRY_STATUSES),
}
# also COALESCE(status, '') IN (...), a status check no index serves
STATUS_IN = re.compile(r"status(?:, ''\))?\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", re.IGNORECASE)
STATUS_IS = re.compile(r"status\s*=\s*'(\w+)'", re.IGNORECASE)


def test_every_query_says_what_it_does() -> None:
    undescribed = [
        name
        for name, sql in sqlbase.load_queries().items()
        if not sql.splitlines()[0].startswith("-- ")
    ]
    assert undescribed == []


def test_every_query_is_used_by_the_library() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in SRC.rglob("*.py"))
    # a family of queries run by a name built in code: f"export_{table}"
    families = tuple(re.findall(r'f"(\w+_)\{', code))
    unused = [
        name
        for name in sqlbase.load_queries()
        if f'"{name}"' not in code
        and not name.startswith(families)
        and "{{" + name + "}}" not in QUERIES  # embedded in another query
    ]
    assert unused == [], f"queries nothing runs: {unused}"


def test_a_query_written_with_its_direction_open_is_made_both_ways() -> None:
    queries = sqlbase.load_queries()
    assert QUERIES.count("-- name: search_workflows") == 1  # written once
    cursor = frozenset({"after_created"})
    newest, oldest = (
        sqlbase.search_sql(queries["search_workflows" + d], queries["search_terms" + d], cursor)
        for d in ("", "_oldest_first")
    )
    assert "ORDER BY created_at DESC" in newest and "created_at < :after_created" in newest
    assert "ORDER BY created_at ASC" in oldest and "created_at > :after_created" in oldest
    assert "{filters}" not in newest + oldest
    left = [name for name, sql in queries.items() if "{past}" in sql or "{order}" in sql]
    assert left == [], f"direction slots left unfilled in {left}"


def test_a_query_embedded_in_others_is_written_once_and_filled_in() -> None:
    queries = sqlbase.load_queries()
    clause = "ON CONFLICT (workflow_id, seq) DO UPDATE"
    assert QUERIES.count(clause) == 1  # the entry_conflict fragment, and nowhere else
    assert clause in queries["upsert_entry"] and clause in queries["fence_and_write_entry"]
    assert queries["create_workflow"].split("INSERT", 1)[1] in queries["create_owned_workflow"]
    assert "-- name:" not in queries["create_owned_workflow"]
    left = [name for name, sql in queries.items() if "{{" in sql]
    assert left == [], f"embedded queries left unfilled in {left}"


def test_status_lists_in_sql_are_the_sets_journal_defines() -> None:
    lists = STATUS_IN.findall(QUERIES)
    assert len(lists) >= 8  # the finished, parked, live and final-entry lists are all found
    for found in lists:
        values = frozenset(v.strip().strip("'") for v in found.split(","))
        assert values in NAMED_SETS.values(), f"({found}) is none of {sorted(NAMED_SETS)}"
    known = {s.value for s in journal.Status} | {s.value for s in journal.EntryStatus}
    assert set(STATUS_IS.findall(QUERIES)) <= known


def test_the_capped_counts_list_every_status() -> None:
    sql = claims._count_capped()
    listed = STATUS_IS.findall(sql)
    assert sorted(listed) == sorted(s.value for s in journal.Status)
    assert sql.count("LIMIT :cap") == len(listed) and "{status}" not in sql


class Verbs:
    """Each verb in a batch of its own, as the store thread runs it."""

    def __init__(self, store: base.Store) -> None:
        self.store = store

    def __getattr__(self, verb: str) -> Any:
        def call(*args: Any) -> Any:
            op = base.Op(getattr(self.store, verb), args, write=True)
            self.store.run_batch([op])
            if op.error is not None:
                raise op.error
            return op.result

        return call


@pytest.fixture
def store(store_url: str) -> Iterator[Any]:
    s = create_store(store_url)
    s.open()
    yield s
    s.close()


def _reversed_columns(sql: str) -> str:
    """The query with its SELECT list in reverse order."""
    head, _, rest = sql.partition("SELECT ")
    columns, _, tail = rest.partition("\nFROM ")
    names = [c.strip() for c in columns.split(",")]
    return f"{head}SELECT {', '.join(reversed(names))}\nFROM {tail}"


def test_rows_become_objects_by_column_name(store: Any) -> None:
    db = Verbs(store)
    new = base.NewWorkflow("wf-1", "refund", '{"args":[],"kwargs":{}}', "v1", "abc")
    info, _ = db.create_workflow(new, "ex-a", NOW + 30, NOW)
    entry = journal.Entry(1, "step", "charge", "started", 2, '"in"', NOW, None, NOW + 5)
    db.open_review("wf-1", info.epoch, entry, "wf-1:1", "it crashed", [entry], NOW)
    before = (db.get_workflow("wf-1"), db.load_history("wf-1"), db.reviews("wf-1"))

    for name in ("get_workflow", "load_history", "entry_at", "open_reviews"):
        store._queries[name] = _reversed_columns(store._queries[name])
    after = (db.get_workflow("wf-1"), db.load_history("wf-1"), db.reviews("wf-1"))

    assert after == before
    assert before[0].version == "v1" and before[0].source_hash == "abc"
    assert before[1] == [entry]
    assert (before[2][0].step, before[2][0].reason) == ("charge", "it crashed")
