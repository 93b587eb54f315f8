"""PostgreSQL: durably lives in a schema of its own, beside the application's tables.

``durably`` by default, ``?schema=NAME`` to choose; a schema holding other
tables is refused; a database laid out by earlier versions (durably's tables
in the role's default schema, normally ``public``) keeps working there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from durably import errors
from durably.storage import base, create_store, postgres, sqlbase
from tests.test_store import NOW, Verbs, new, owned

NEWEST = sqlbase.load_migrations()[-1][0]


def admin_rows(url: str, statement: str) -> list[Any]:
    """One statement on a plain connection (the role's default search_path), committed."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        cursor = pg.execute(statement)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def tables_in(url: str, schema: str) -> set[str]:
    rows = admin_rows(url, f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")
    return {r[0] for r in rows}


def opened(url: str) -> Verbs:
    store = create_store(url)
    store.open()
    return Verbs(store)


@pytest.fixture
def empty_pg(pg_cluster: Any) -> Any:
    name = pg_cluster.create_database(prefix="schema")
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


def test_a_database_with_an_application_table_in_public_works(empty_pg: str) -> None:
    admin_rows(empty_pg, "CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT)")
    admin_rows(empty_pg, "INSERT INTO customers VALUES (1, 'Ada')")
    db = opened(empty_pg)
    try:
        owned(db, "wf-1")
        assert db.get_workflow("wf-1").status == "running"
        assert db.schema_version() == NEWEST
    finally:
        db.store.close()
    assert tables_in(empty_pg, "public") == {"customers"}
    assert {"workflows", "journal", "durably_migrations"} <= tables_in(empty_pg, "durably")
    assert admin_rows(empty_pg, "SELECT name FROM customers") == [("Ada",)]


def test_two_schemas_in_one_database_are_isolated(empty_pg: str) -> None:
    a = opened(f"{empty_pg}?schema=team_a")
    b = opened(f"{empty_pg}?schema=team_b")
    heard_a: list[base.Wakeup] = []
    heard_b: list[base.Wakeup] = []
    stop_a, stop_b = a.store.listen(heard_a.append), b.store.listen(heard_b.append)
    try:
        owned(a, "only-in-a")
        b.create_workflow(new("only-in-b"), None, None, NOW)  # notifies "work" in b
        assert a.get_workflow("only-in-b") is None
        assert b.get_workflow("only-in-a") is None
        assert [w.workflow_id for w in a.list_workflows(None, None, 10)] == ["only-in-a"]
        # Each listener issues LISTEN from its own thread: notify until both hear.
        for store, heard in ((a, heard_a), (b, heard_b)):
            deadline = time.monotonic() + 15
            while not heard:
                assert time.monotonic() < deadline, "a listener heard nothing in 15 s"
                store.create_workflow(new(f"poke-{time.monotonic()}"), None, None, NOW)
                time.sleep(0.05)
        heard_a.clear()
        heard_b.clear()
        # Now both listen: the wake-up of b reaches b's listener, never a's. Signals name
        # their workflow, and notifications arrive in commit order: had a's listener heard
        # b's, it would be in heard_a before a's own.
        b.send_signal("only-in-b", "from-b", "1", None, NOW)
        from_b = base.Wakeup("signal", "only-in-b", "from-b")
        deadline = time.monotonic() + 15
        while from_b not in heard_b:
            assert time.monotonic() < deadline, "b's listener heard nothing in 15 s"
            time.sleep(0.01)
        a.send_signal("only-in-a", "from-a", "1", None, NOW)
        from_a = base.Wakeup("signal", "only-in-a", "from-a")
        deadline = time.monotonic() + 15
        while from_a not in heard_a:
            assert time.monotonic() < deadline, "a's listener heard nothing in 15 s"
            time.sleep(0.01)
        assert from_b not in heard_a and from_a not in heard_b, (heard_a, heard_b)
    finally:
        stop_a()
        stop_b()
        a.store.close()
        b.store.close()
    assert "workflows" in tables_in(empty_pg, "team_a")
    assert "workflows" in tables_in(empty_pg, "team_b")
    assert tables_in(empty_pg, "durably") == set()
    assert tables_in(empty_pg, "public") == set()


def test_a_schema_holding_foreign_tables_is_refused(empty_pg: str) -> None:
    admin_rows(empty_pg, "CREATE SCHEMA billing")
    admin_rows(empty_pg, "CREATE TABLE billing.invoices (id BIGINT PRIMARY KEY)")
    store = create_store(f"{empty_pg}?schema=billing")
    with pytest.raises(errors.NotADurablyDatabase, match=r"schema 'billing'.*invoices"):
        store.open()
    assert tables_in(empty_pg, "billing") == {"invoices"}  # nothing was written


@pytest.mark.parametrize(
    "schema", ["", "Durably", "1abc", "a-b", "a;drop", "pg_catalog", "x" * 49, "a b"]
)
def test_a_bad_schema_name_is_refused_with_the_name(pg_cluster: Any, schema: str) -> None:
    url = pg_cluster.url("postgres") + f"?schema={schema}"
    with pytest.raises(errors.DurablyError, match="is not a schema name durably accepts"):
        create_store(url)


def test_an_old_layout_database_in_public_keeps_working(empty_pg: str) -> None:
    """A database migrated by an earlier durably (tables in public) stays in public."""
    # Lay it out as earlier versions did: every migration run in the default schema.
    admin_rows(
        empty_pg,
        "CREATE TABLE durably_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at DOUBLE PRECISION NOT NULL)",
    )
    for version, name, text in sqlbase.load_migrations()[:-1]:  # one migration behind
        for statement in sqlbase.split_statements(text):
            admin_rows(empty_pg, statement)
        admin_rows(empty_pg, f"INSERT INTO durably_migrations VALUES ({version}, '{name}', 0)")
    admin_rows(
        empty_pg,
        "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at)"
        " VALUES ('old-1', 'refund', 'pending', '{}', 0, 0)",
    )
    db = opened(empty_pg)
    try:
        assert db.store.schema == "public"  # type: ignore[attr-defined]
        assert db.schema_version() == NEWEST  # the missing migration went into public too
        assert db.get_workflow("old-1").status == "pending"
        owned(db, "new-1")
    finally:
        db.store.close()
    assert tables_in(empty_pg, "durably") == set()
    newest = admin_rows(empty_pg, "SELECT max(version) FROM public.durably_migrations")
    assert newest == [(NEWEST,)]
    rows = admin_rows(empty_pg, "SELECT workflow_id FROM public.workflows ORDER BY 1")
    assert rows == [("new-1",), ("old-1",)]


def test_the_schema_is_shown_in_the_url_and_channel(pg_cluster: Any) -> None:
    store = postgres.PostgresStore(pg_cluster.url("postgres") + "?schema=team_a&sslmode=disable")
    assert store.url.endswith("?schema=team_a&sslmode=disable")
    assert store.channel == "durably.team_a"


def test_a_role_that_cannot_create_the_schema_is_told_what_to_do(
    pg_cluster: Any, empty_pg: str
) -> None:
    """A plain role lacks CREATE on the database: a clear error; a schema made for it works."""
    dbname = empty_pg.rsplit("/", 1)[1]
    role = f"app_{dbname}"
    admin_rows(empty_pg, f"CREATE ROLE {role} LOGIN")
    try:
        as_app = pg_cluster.url(dbname, user=role)
        with pytest.raises(errors.StoreError, match=r"cannot create schema 'durably'.*GRANT"):
            create_store(as_app).open()
        admin_rows(empty_pg, f"CREATE SCHEMA durably AUTHORIZATION {role}")  # what a DBA does
        db = opened(as_app)
        try:
            owned(db, "wf-1")
        finally:
            db.store.close()
    finally:
        admin_rows(empty_pg, f"DROP OWNED BY {role} CASCADE")
        admin_rows(empty_pg, f"DROP ROLE {role}")
