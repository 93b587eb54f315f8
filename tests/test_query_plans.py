"""The queries an engine runs again and again (claims, wake-ups, a queue's admission, a
parent's wait, the timer loop, a batch of retention's pruning) read the live workflows
through indexes, never every finished one (pruning reads a batch of them): on a database
holding 20,000 finished workflows each does a few hundred rows' work,
counted on both dialects (SQLite as it runs in production, without ANALYZE; PostgreSQL
after it, as autovacuum would)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durably.storage import create_store
from durably.storage.base import WorkflowQuery

FINISHED = 20_000

#: The queries a claim, a wake-up, a queue's admission, a parent's wait and the timer
#: loop run, with parameters (the superset; each takes the ones it names).
PARAMS = {
    "now": time.time(),
    "limit": 10,
    "queue": "q",
    "owner": "executor-1",
    "workflow_id": "live-3",
    "concurrency": 5,
    "since": time.time() - 60,
    "before": time.time(),  # every finished workflow old enough to prune
    "status": None,
}
HOT_QUERIES = (
    "claimable_unqueued",
    "claimable_queued",
    "claimable_partitioned",
    "queue_load",
    "next_wake",
    "unfinished_children",
    "unclaimed",
    "due_deadlines",
    "cancels_asked",  # the recovery pass's look for cancels asked elsewhere (SQLite)
    "prunable",  # a batch of retention's pruning, in its write transaction
)


def _fill(store: Any) -> None:
    """20,000 finished top-level workflows, then a few live ones of every kind."""
    rows = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) "
        "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at, "
        "owner, queue, wake_at, parent_id, partition_key) "
        "SELECT '{prefix}' || CAST(i AS TEXT), 'n', {status}, '[]', i, i, "
        "{owner}, {queue}, {wake_at}, {parent}, NULL FROM n"
    )
    kinds = [
        ("done-", FINISHED, "'completed'", "NULL", "NULL", "NULL", "NULL"),
        ("live-", 20, "'pending'", "NULL", "NULL", "NULL", "NULL"),
        ("queued-", 20, "'pending'", "NULL", "'q'", "NULL", "NULL"),
        ("running-", 20, "'running'", "'executor-1'", "NULL", "NULL", "NULL"),
        ("asleep-", 20, "'sleeping'", "NULL", "NULL", "1e12", "NULL"),
        ("child-", 20, "'completed'", "NULL", "NULL", "NULL", "'live-3'"),
    ]
    for prefix, count, status, owner, queue, wake_at, parent in kinds:
        store._execute(
            rows.format(
                prefix=prefix,
                count=count,
                status=status,
                owner=owner,
                queue=queue,
                wake_at=wake_at,
                parent=parent,
            ),
            {},
        )
    store._execute(store._queries["create_runnable"], {})
    runnable = "INSERT INTO runnable_here (name, version, source_hash) VALUES ('n', '', '')"
    store._execute(runnable, {})


def _postgres_rows(store: Any, sql: str, params: Any = PARAMS, relation: str = "workflows") -> int:
    """How many rows of ``relation`` the server reads for the statement, filtered out or
    not."""
    (plan,) = store._execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    read = 0
    nodes = [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", ()))
        if node.get("Relation Name") == relation:
            loops = node.get("Actual Loops", 1)
            read += loops * (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
    return read


@pytest.fixture(params=["sqlite", "postgres"])
def filled(request: pytest.FixtureRequest) -> Iterator[tuple[Any, bool]]:
    """(a store holding 20,000 finished workflows and a few live ones, whether it is
    PostgreSQL), analyzed there as autovacuum would."""
    postgres = request.param == "postgres"
    store: Any = create_store(request.getfixturevalue(f"{request.param}_url"))
    store.open()
    try:
        _fill(store)
        if postgres:
            store._execute("ANALYZE workflows", {})
        yield store, postgres
    finally:
        store.close()


def _light(work: dict[str, int], postgres: bool) -> None:
    """Each read did a few hundred rows' work: reading the 20,000 finished workflows
    costs a row (PostgreSQL) or a dozen instructions (SQLite) each."""
    limit = 1_000 if postgres else 10_000
    heavy = {name: n for name, n in work.items() if n > limit}
    dialect = "postgres" if postgres else "sqlite"
    assert not heavy, f"these read the finished workflows ({dialect}): {heavy}"


def test_the_queries_run_again_and_again_read_the_live_workflows_not_the_finished(
    filled: tuple[Any, bool],
) -> None:
    store, postgres = filled
    _light(
        {
            q: _work(store, postgres, lambda q=q: store._execute(store._queries[q], PARAMS))
            for q in HOT_QUERIES
        },
        postgres,
    )


#: The pages an operator reads (the dashboard, `durably workflows`, list_workflows) and
#: the dashboard's look every half second: each reads a page's rows through an index.
PAGES = {
    "newest": WorkflowQuery(limit=50),
    "oldest": WorkflowQuery(limit=50, order="asc"),
    "past a cursor": WorkflowQuery(limit=50, after=(10_000.0, "done-10000")),
    "past a cursor, oldest first": WorkflowQuery(
        limit=50, order="asc", after=(10_000.0, "done-10000")
    ),
    "failed": WorkflowQuery(limit=50, status="failed"),
    "completed, oldest first": WorkflowQuery(limit=50, status="completed", order="asc"),
    "by ids": WorkflowQuery(ids=("done-5", "live-3", "nobody")),
    "by ids, completed": WorkflowQuery(ids=("done-5", "live-3", "nobody"), status="completed"),
    "by ids, on a queue": WorkflowQuery(ids=("queued-3", "done-5"), queue="q"),
    "by ids, children": WorkflowQuery(ids=("child-3", "done-5"), parent_id="live-3"),
    "on a queue": WorkflowQuery(queue="q"),
    "children": WorkflowQuery(parent_id="live-3"),
    "created between": WorkflowQuery(created_after=15_000.0, created_before=15_040.0),
    # an id prefix few workflows have is read as the prefix's range of the primary key; one
    # most have, newest first until the page is full
    "by a rare id prefix": WorkflowQuery(limit=50, id_prefix="done-1234"),
    "by an id prefix, oldest first": WorkflowQuery(limit=50, id_prefix="done-1234", order="asc"),
    "by an id prefix none has": WorkflowQuery(limit=50, id_prefix="gone-"),
    "by an id prefix all the finished have": WorkflowQuery(limit=50, id_prefix="done-"),
}


def ids(found: list[Any]) -> list[str]:
    return [w.workflow_id for w in found]


def _work(store: Any, postgres: bool, call: Callable[[], Any], relation: str = "workflows") -> int:
    """The work of every statement ``call`` sends: rows of ``relation`` read (PostgreSQL,
    by EXPLAIN ANALYZE of each again) or instructions run (SQLite)."""
    if not postgres:
        conn = store._conn
        steps = [0]

        def count() -> int:
            steps[0] += 100
            return 0

        conn.set_progress_handler(count, 100)
        try:
            result = call()
            if hasattr(result, "fetchall"):  # a cursor: run the statement to its end
                result.fetchall()
        finally:
            conn.set_progress_handler(None, 0)
        return steps[0]
    sent: list[tuple[str, Any]] = []
    execute = store._execute
    store._execute = lambda sql, params=None: sent.append((sql, params)) or execute(sql, params)
    try:
        call()
    finally:
        del store._execute
    return sum(_postgres_rows(store, sql, params, relation) for sql, params in sent)


def test_a_page_of_workflows_and_the_dashboards_look_read_a_page_not_the_history(
    filled: tuple[Any, bool],
) -> None:
    store, postgres = filled
    pages = {name: store.search_workflows(q) for name, q in PAGES.items()}
    assert [w.workflow_id for w in pages["newest"][:2]] == ["done-20000", "done-19999"]
    assert [w.workflow_id for w in pages["past a cursor"][:2]] == ["done-9999", "done-9998"]
    assert pages["past a cursor, oldest first"][0].workflow_id == "done-10001"
    assert pages["failed"] == [] and len(pages["completed, oldest first"]) == 50
    assert [w.workflow_id for w in pages["by ids"]] == ["done-5", "live-3"]
    assert [w.workflow_id for w in pages["by ids, completed"]] == ["done-5"]
    assert [w.workflow_id for w in pages["by ids, on a queue"]] == ["queued-3"]
    assert [w.workflow_id for w in pages["by ids, children"]] == ["child-3"]
    assert len(pages["on a queue"]) == 20 and len(pages["children"]) == 20
    assert len(pages["created between"]) == 40
    rare = ["done-12349", "done-12348"]  # done-1234 and done-12340 to done-12349
    assert len(pages["by a rare id prefix"]) == 11 and ids(pages["by a rare id prefix"])[:2] == rare
    assert ids(pages["by an id prefix, oldest first"])[:2] == ["done-1234", "done-12340"]
    assert pages["by an id prefix none has"] == []
    assert ids(pages["by an id prefix all the finished have"])[:1] == ["done-20000"]
    assert store.count_unfinished() == {"pending": 40, "running": 20, "sleeping": 20}
    work = {
        name: _work(store, postgres, lambda q=q: store.search_workflows(q))
        for name, q in PAGES.items()
    }
    work["unfinished counts"] = _work(store, postgres, store.count_unfinished)
    # the dashboard's counts: every status, up to a cap (the exact ones read every workflow)
    assert store.count_by_status(100) == {
        "completed": 100,
        "pending": 40,
        "running": 20,
        "sleeping": 20,
    }
    work["counts up to 100"] = _work(store, postgres, lambda: store.count_by_status(100))
    _light(work, postgres)


def test_a_batch_of_pruning_reads_its_batch_not_the_history(sqlite_url: str) -> None:
    """A batch of 200 of retention's pruning, in its write transaction, over 20,000
    finished workflows: its candidates and its deletes read the batch's rows (SQLite,
    which plans without ANALYZE: a long id list beside a status check was read through
    the status index, every finished workflow)."""
    from durably.storage import base

    store: Any = create_store(sqlite_url)
    store.open()
    try:
        _fill(store)
        op = base.Op(store.prune, (time.time(), None, 200), True)
        work = _work(store, False, lambda: store.run_batch([op]))
        assert op.error is None and len(op.result) == 200, op.error
        assert work <= 100_000, f"a batch of 200 ran {work} SQLite instructions"
    finally:
        store.close()
