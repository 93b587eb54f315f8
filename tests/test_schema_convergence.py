"""Migrations converge: a database migrated one version at a time, from the first schema,
has the same tables, columns, types and indexes as a fresh one, on both backends; and two
processes starting at once on a fresh database both succeed."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durably.storage import create_store, sqlbase
from tests import children

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """Makes empty databases (no durably schema) on each backend."""
    made = iter(range(100))

    def make() -> str:
        n = next(made)
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / f'fresh{n}.db'}"
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_database(prefix="fresh")
        request.addfinalizer(lambda: cluster.drop_database(name))
        return str(cluster.url(name))

    return make


def schema_of(url: str) -> dict[str, Any]:
    """Tables with their columns (name, type, nullability, default, key) and indexes."""
    store: Any = create_store(url)
    store.open()
    try:
        if url.startswith("sqlite"):
            tables = sorted(store._table_names())
            columns = {
                t: [tuple(r[1:]) for r in store._execute(f"PRAGMA table_info({t})").fetchall()]
                for t in tables
            }
            indexes = store._execute(
                "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' ORDER BY name"
            ).fetchall()
        else:
            rows = store._execute(
                "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
                "column_default FROM information_schema.columns WHERE table_schema = %(s)s "
                "ORDER BY table_name, ordinal_position",
                {"s": store.schema},
            ).fetchall()
            tables = sorted({r[0] for r in rows})
            columns = {t: [tuple(r[1:]) for r in rows if r[0] == t] for t in tables}
            indexes = store._execute(
                "SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = %(s)s "
                "ORDER BY indexname",
                {"s": store.schema},
            ).fetchall()
        return {"tables": tables, "columns": columns, "indexes": [tuple(i) for i in indexes]}
    finally:
        store.close()


def test_migrating_one_version_at_a_time_equals_a_fresh_schema(
    fresh_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    migrations = sqlbase.load_migrations()
    assert len(migrations) >= 4
    stepwise = fresh_url()
    for k in range(1, len(migrations) + 1):  # as each release of durably would have left it
        monkeypatch.setattr(sqlbase, "load_migrations", lambda k=k: migrations[:k])
        store = create_store(stepwise)
        store.open()
        try:
            assert store.schema_version() == migrations[k - 1][0]
        finally:
            store.close()
    monkeypatch.undo()
    fresh = schema_of(fresh_url())
    assert schema_of(stepwise) == fresh
    assert {"workflows", "journal", "signals", "reviews", "queues"} <= set(fresh["tables"])
    assert len(fresh["indexes"]) >= 10


STARTER = """
import os, sys, time
sys.path[:0] = [{src!r}]
from durably.storage import create_store
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.001)
store = create_store(sys.argv[1])
store.open()
print(store.schema_version())
store.close()
"""


def test_two_processes_starting_at_once_on_a_fresh_database_both_succeed(
    fresh_url: Callable[[], str], tmp_path: Path
) -> None:
    newest = sqlbase.load_migrations()[-1][0]
    code = STARTER.format(src=str(REPO / "src"))
    env = children.child_env()
    for attempt in range(3):
        url = fresh_url()
        go = tmp_path / f"go{attempt}"
        ready = [tmp_path / f"ready{attempt}-{i}" for i in range(2)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, url, str(ready[i]), str(go)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in ready):
            assert time.monotonic() < deadline, "the starters never got ready"
            time.sleep(0.01)
        go.touch()  # both open the fresh database now
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert out.split() == [str(newest)]
        if url.startswith("sqlite"):
            path = url.removeprefix("sqlite:///")
            conn = sqlite3.connect(path)
            applied = conn.execute("SELECT version FROM durably_migrations").fetchall()
            conn.close()
            assert sorted(v for (v,) in applied) == [m[0] for m in sqlbase.load_migrations()]


def _docs_builds() -> dict[str, str]:
    """The CREATE INDEX CONCURRENTLY statements docs/operations.md gives, by index."""
    text = " ".join((Path(__file__).parent.parent / "docs" / "operations.md").read_text().split())
    found = re.findall(r"`(CREATE INDEX CONCURRENTLY IF NOT EXISTS (\w+) [^`]+)`", text)
    return {index: statement for statement, index in found}


@pytest.mark.parametrize(
    ("position", "migration", "index"),
    [(10, "created_index", "workflows_by_created"), (11, "open_entries", "journal_open")],
)
def test_an_index_built_beforehand_as_the_docs_say_is_found_by_its_migration(
    fresh_url: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
    position: int,
    migration: str,
    index: str,
) -> None:
    """docs/operations.md: on a large PostgreSQL database, build 0011's or 0012's index
    first with the CREATE INDEX CONCURRENTLY it gives (no write blocked); the migration
    then finds it built."""
    migrations = sqlbase.load_migrations()
    assert migrations[position][1] == migration
    statement = _docs_builds()[index]
    url = fresh_url()
    monkeypatch.setattr(sqlbase, "load_migrations", lambda: migrations[:position])
    store: Any = create_store(url)
    store.open()
    if url.startswith("sqlite"):
        statement = statement.replace("CONCURRENTLY ", "")
    store._execute(statement)
    store.close()
    monkeypatch.undo()
    store = create_store(url)
    store.open()  # runs the migration and what follows
    try:
        assert store.schema_version() == migrations[-1][0]
    finally:
        store.close()
    assert schema_of(url) == schema_of(fresh_url())
