"""``python -m benchmarks.history``: what an operator's reads cost over a long history.

    python -m benchmarks.history [--finished N] [--postgres URL] [--no-postgres]

A long-lived database holds mostly finished workflows. For SQLite (FULL) and
PostgreSQL (a throwaway cluster, or ``--postgres URL``) this fills a database
with N/10 finished workflows, then with N (one ``INSERT ... SELECT`` each, and
a few live ones), and times each read an operator or a dashboard makes, best of
7: pages of workflows (``search_workflows``), the counts by status, a batch of
retention's pruning with nothing old enough and the candidates of one in a
backlog (``prunable``), and the dashboard's look at every half second
(``durably.server.api.looked_at``), of the list page and of a running agent's page
whose journal holds N/100, then N/10 entries of 1.5 KB model answers (beside it, that
journal read whole, as the agent page's look read it before ``history_mark``). The
baseline, measured in the same run, is
a primary-key read of one workflow: a read that does not grow with history
costs the same multiple of it at both sizes, and its last column (the growth
from N/10 to N) stays near 1.

This is a benchmark, not a test: nothing asserts on speed. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from typing import Any

import durably
from benchmarks.__main__ import postgres
from durably.storage import base, create_store
from durably.storage.base import WorkflowQuery

READS: dict[str, Callable[[Any, Any], Any]] = {
    "newest 50": lambda store, _: store.search_workflows(WorkflowQuery(limit=50)),
    "oldest 50": lambda store, _: store.search_workflows(WorkflowQuery(limit=50, order="asc")),
    "50 past a cursor": lambda store, _: store.search_workflows(
        WorkflowQuery(limit=50, after=(1_000.5, "done-1000"))
    ),
    "50 failed (none)": lambda store, _: store.search_workflows(
        WorkflowQuery(limit=50, status="failed")
    ),
    "50 by id": lambda store, _: store.search_workflows(
        WorkflowQuery(ids=tuple(f"done-{i}" for i in range(1, 51)))
    ),
    "50 by id prefix (rare)": lambda store, _: store.search_workflows(
        WorkflowQuery(limit=50, id_prefix="done-1234")
    ),
    "50 by id prefix (none)": lambda store, _: store.search_workflows(
        WorkflowQuery(limit=50, id_prefix="gone-")
    ),
    "50 by id prefix (all)": lambda store, _: store.search_workflows(
        WorkflowQuery(limit=50, id_prefix="done-")
    ),
    "unfinished counts": lambda store, _: store.count_unfinished(),
    "prune, none old enough": lambda store, _: _prune(store, 0.0),
    "200 prunable (backlog)": lambda store, _: store._execute(
        store._queries["prunable"], {"status": None, "before": 1e12, "limit": 200}
    ).fetchall(),
    "counts by status": lambda store, _: store.count_by_status(),
    "counts up to 10,000": lambda store, _: store.count_by_status(10_000),
}


def _prune(store: Any, before: float) -> list[str]:
    """A batch of retention's pruning (``Store.prune``) as the engine runs it: one write
    transaction."""
    op = base.Op(store.prune, (before, None, 200), write=True)
    store.run_batch([op])
    if op.error is not None:
        raise op.error
    pruned: list[str] = op.result
    return pruned


def _looks() -> dict[str, Callable[[Any, Any], Any]]:
    """The dashboard's looks (its server extra installed), else none."""
    if importlib.util.find_spec("starlette") is None:
        return {}
    from durably.server import api

    return {
        # as an open page's stream looks while nothing changes (the finished workflows'
        # counts are read again on a change, or every 10 s)
        "the dashboard's look": lambda _, client: api.looked_at(client, None),
        # the page of the long agent (its journal a tenth as long as the history)
        "agent page's look": lambda _, client: api.looked_at(client, "agent"),
    }


#: Characters of each of the long agent's results (a model's answer).
ANSWER = 1_500


def _fill_journal(store: Any, first: int, last: int) -> None:
    """Entries FIRST..LAST of the running workflow ``agent``: model answers of ``ANSWER``
    characters that no database compresses away."""
    postgres_url = store.url.startswith("postgres")
    if first == 1:
        store._execute(
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
            "VALUES ('agent', 'agent', 'running', '[]', 0, 0)",
            {},
        )
    answer = (
        "(SELECT string_agg(md5(CAST(random() AS TEXT) || CAST(g AS TEXT)), '') "
        f"FROM generate_series(1, {ANSWER // 32}) g)"
        if postgres_url
        else f"hex(randomblob({ANSWER // 2}))"
    )
    rows = (
        "INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, "
        f"started_at, finished_at) SELECT 'agent', i, 'step', 'model', 'completed', 1, "
        f"{answer}, i, i FROM "
    )
    _insert_series(store, first, last, rows)


def _insert_series(store: Any, first: int, last: int, insert: str) -> None:
    """Run ``insert`` (an ``INSERT ... SELECT ... FROM`` left open) over the numbers
    ``i`` from FIRST to LAST, in one committed transaction, in either dialect."""
    if store.url.startswith("postgres"):
        sql = insert + f"generate_series({first}, {last}) AS n(i)"
    else:
        sql = (
            f"WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n "
            f"WHERE i < {last}) " + insert + "n"
        )
    store._begin(True)
    store._execute(sql, {})
    store._commit()


def _fill(store: Any, first: int, last: int, status: str = "completed") -> None:
    """Workflows done-FIRST..done-LAST (created at their number) of ``status``, committed."""
    prefix = "done-" if status == "completed" else "live-"
    insert = (
        "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
        f"SELECT '{prefix}' || CAST(i AS TEXT), 'n', '{status}', '[]', i, i FROM "
    )
    _insert_series(store, first, last, insert)
    if store.url.startswith("postgres"):
        store._execute("VACUUM ANALYZE workflows", {})  # as autovacuum would, after a while


def _best_ms(fn: Callable[[], Any], times: int = 7) -> float:
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def measure(url: str, finished: int) -> dict[str, tuple[float, float]]:
    """{read: (ms at finished/10, ms at finished)}, the baseline under 'primary-key read'."""
    store: Any = create_store(url)
    store.open()
    client = durably.Client(url)
    found: dict[str, list[float]] = {}
    try:
        _fill(store, 1, 100, "sleeping")  # and a hundred live ones, parked
        done = 0
        for size in (finished // 10, finished):
            _fill(store, done + 1, size)
            _fill_journal(store, done // 10 + 1, size // 10)
            done = size
            reads: dict[str, Callable[[Any, Any], Any]] = {
                "primary-key read": lambda s, _: s.get_workflow("done-7"),
                **READS,
                **_looks(),
                # what the agent page's look read before the history mark (issue 12)
                "agent's whole journal": lambda _, client: (
                    client.history("agent"),
                    client.signals("agent"),
                ),
            }
            for name, read in reads.items():
                ms = _best_ms(lambda read=read: read(store, client))  # type: ignore[misc]
                found.setdefault(name, []).append(ms)
    finally:
        client.close()
        store.close()
    return {name: (ms[0], ms[1]) for name, ms in found.items()}


def print_table(title: str, results: dict[str, tuple[float, float]], finished: int) -> None:
    small, big = f"{finished // 10:,}", f"{finished:,}"
    base = results["primary-key read"]
    print(f"\n{title}")
    print(f"{'read':<22} | {small + ' ms':>12} | {big + ' ms':>12} | {'x key read':>10} | growth")
    for name, (a, b) in results.items():
        print(f"{name:<22} | {a:>12.3f} | {b:>12.3f} | {b / base[1]:>10.1f} | {b / a:.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__)
    parser.add_argument("--finished", type=int, default=200_000, help="finished workflows")
    parser.add_argument("--postgres", metavar="URL", help="a superuser URL of a server to use")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    if args.finished < 100:
        parser.error("--finished must be at least 100")
    print(f"durably: reads over {args.finished:,} finished workflows (best of 7)")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite:///{tmp}/history.db"
        print_table("SQLite (FULL)", measure(sqlite_url, args.finished), args.finished)
    if args.no_postgres:
        return 0
    with postgres(args.postgres) as (make, note):
        if make is None:
            print(f"\n{note}")
            return 0
        print_table(note, measure(make("durably_history"), args.finished), args.finished)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
