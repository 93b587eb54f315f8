"""Migrations run at start and keep unfinished workflows written by an older schema."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path

import durably
from durably.storage import sqlbase as sql

RAN: list[str] = []


@durably.step
async def old_step(n: int) -> int:
    RAN.append(f"old {n}")
    return n


@durably.workflow
async def written_by_v1(n: int) -> list[int]:
    a = await old_step(n)
    b = await old_step(n + 1)
    return [a, b]


def _apply_first_migration_only(path: Path) -> None:
    """A database as durably's first schema left it, with a half-done workflow in it."""
    version, name, text = sql.load_migrations()[0]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TABLE durably_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at DOUBLE PRECISION NOT NULL)"
    )
    for statement in sql.split_statements(text):
        conn.execute(statement)
    conn.execute("INSERT INTO durably_migrations VALUES (?, ?, ?)", (version, name, time.time()))
    now = time.time()
    conn.execute(
        "INSERT INTO workflows (workflow_id, name, status, input, owner, epoch, "
        "lease_expires_at, crash_count, created_at, updated_at) "
        "VALUES (?, ?, 'running', ?, 'gone:1:x', 1, ?, 0, ?, ?)",
        ("old-1", "written_by_v1", json.dumps({"args": [10], "kwargs": {}}), now - 1, now, now),
    )
    conn.execute(
        "INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at, "
        "finished_at) VALUES ('old-1', 1, 'step', 'old_step', 'completed', 1, '10', ?, ?)",
        (now, now),
    )
    conn.close()


async def test_an_unfinished_workflow_of_the_first_schema_resumes_after_migration(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    _apply_first_migration_only(path)
    url = f"sqlite:///{path}"
    async with durably.Engine(url, poll_interval=0.1) as engine:
        assert await engine.handle("old-1").result(timeout=10) == [10, 11]
    assert RAN == ["old 11"]  # the step recorded under the old schema did not run again
    with durably.Client(url) as client:
        assert client.schema_version() == sql.load_migrations()[-1][0]


def _dump(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return "\n".join(conn.iterdump())


def test_migrating_twice_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with durably.Client(url) as client:
        first = client.schema_version()
    dump1 = _dump(tmp_path / "db.sqlite")
    with durably.Client(url) as client:
        assert client.schema_version() == first
    dump2 = _dump(tmp_path / "db.sqlite")
    assert [line for line in dump1.splitlines() if "durably_migrations" not in line] == [
        line for line in dump2.splitlines() if "durably_migrations" not in line
    ]
