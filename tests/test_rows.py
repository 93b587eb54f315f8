"""Rows by column name (storage/rows.py): each query's own names, lower case, through
SQLite's cursor, psycopg's and the pipeline's answers, however often a set is read."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import psycopg
import pytest

from durably.storage import pg_direct, postgres, rows


def _tables(execute: Any) -> None:
    execute("CREATE TEMPORARY TABLE a (k int, v text)")
    execute("CREATE TEMPORARY TABLE b (v text, k int, extra int)")
    execute("INSERT INTO a VALUES (1, 'x')")
    execute("INSERT INTO b VALUES ('y', 2, 3)")


def _read_all(execute: Any) -> None:
    """Each query read twice (decoded, then as kept): its own columns, in its order."""
    for _ in range(2):
        assert rows.first(execute("SELECT * FROM a")) == {"k": 1, "v": "x"}
        assert rows.first(execute("SELECT * FROM b")) == {"v": "y", "k": 2, "extra": 3}
        # the same count of columns, other names; an upper case alias read in lower case
        assert rows.every(execute('SELECT k AS "Upper", v FROM a')) == [{"upper": 1, "v": "x"}]
        assert rows.names(execute("SELECT v, k FROM a")) == ("v", "k")


def test_sqlite_rows_are_named_by_each_querys_columns() -> None:
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        _tables(conn.execute)
        _read_all(conn.execute)


def test_postgresql_rows_are_named_by_each_querys_columns(postgres_url: str) -> None:
    url, _ = postgres.split_schema(postgres_url)
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        _tables(conn.execute)
        _read_all(conn.execute)  # psycopg's cursors
        direct = pg_direct.Direct(conn)
        _read_all(lambda text: direct.execute(text, None))  # the pipeline's answers


def test_the_kept_names_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows, "_NAMES", {})
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for i in range(rows._NAMES_KEPT + 10):
            assert rows.names(conn.execute(f"SELECT 1 AS c{i}")) == (f"c{i}",)
            assert len(rows._NAMES) <= rows._NAMES_KEPT
