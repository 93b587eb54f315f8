"""Shared fixtures: database URLs for every backend the suite runs on."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durably.storage import create_store

# pytest-xdist's workers run with COLUMNS=80 (the controller's width): rich fixes the
# command line's console at the COLUMNS of the moment it is made, and every
# CliRunner(env={"COLUMNS": ...}) after would be ignored. Each test sets its own, so the
# console is made here with COLUMNS unset (it reads COLUMNS at each print then): the
# group imports the module that makes it only with the first command run, which may
# be a test's with COLUMNS set.
os.environ.pop("COLUMNS", None)
importlib.import_module("durably.cli.base")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database file for one test."""
    return f"sqlite:///{tmp_path / 'durably.db'}"


# --- PostgreSQL: one throwaway cluster per session, one database per test -------------

POSTGRES_TEMPLATE = "durably_template"


def _no_postgres(reason: str) -> None:
    """Skip the postgres tests, or fail them when DURABLY_REQUIRE_POSTGRES=1 (CI)."""
    if os.environ.get("DURABLY_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"DURABLY_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason} (DURABLY_REQUIRE_POSTGRES=1 makes this fail)")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A PostgreSQL cluster for the session, with a migrated template database.

    Started with initdb and pg_ctl from PATH (as the postgres user when run as
    root); stopped and deleted at the end of the session, whatever happened.
    """
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _no_postgres("psycopg is not installed (pip install -e '.[dev]')")
    from tests import pgcluster

    missing = pgcluster.missing_tools()
    if missing:
        _no_postgres(f"{', '.join(missing)} not found")
    cluster = pgcluster.PgCluster.start()
    try:
        cluster.execute(f"CREATE DATABASE {POSTGRES_TEMPLATE}")
        template = create_store(cluster.url(POSTGRES_TEMPLATE))
        template.open()  # migrates
        template.close()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(pg_cluster: Any) -> Iterator[str]:
    """A fresh PostgreSQL database for one test, cloned from the migrated template."""
    name = pg_cluster.create_database(template=POSTGRES_TEMPLATE)
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh durably database on each backend: the storage suite runs on both."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def empty_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database on each backend with nothing in it (not even durably's schema)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    cluster = request.getfixturevalue("pg_cluster")
    name = cluster.create_database(prefix="empty")
    request.addfinalizer(lambda: cluster.drop_database(name))
    return str(cluster.url(name))


@pytest.fixture
def dashboard(store_url: str) -> Iterator[tuple[str, Any]]:
    """(the URL, a Starlette test client of the dashboard logged in), on both dialects."""
    from starlette.testclient import TestClient

    from durably.server import app, auth
    from tests.serverkit import harness

    with TestClient(app.create_app(store_url, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        harness.login(c, next="/")
        yield store_url, c


@pytest.fixture
def api_client(store_url: str) -> Iterator[tuple[str, Any]]:
    """(the URL, a Starlette test client of the JSON API with the bearer token), on both
    dialects."""
    from starlette.testclient import TestClient

    from durably.server import app, auth
    from tests.serverkit import harness

    with TestClient(app.create_app(store_url, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        c.headers.update({"Authorization": f"Bearer {harness.SECRET}"})
        yield store_url, c
