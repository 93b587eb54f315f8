"""Storage backends behind one interface, chosen by the database URL."""

from __future__ import annotations

import os

from durably import errors
from durably.storage import base

DEFAULT_URL = "sqlite:///durably.db"


def resolve_url(url: str | None) -> str:
    """The URL given, else DURABLY_DATABASE_URL, else sqlite:///durably.db."""
    return url or os.environ.get("DURABLY_DATABASE_URL") or DEFAULT_URL


def create_store(url: str, *, create: bool = True) -> base.Store:
    """An unopened Store for the URL's scheme.

    With ``create=False`` opening it never creates a database: a missing SQLite
    file, or a database without durably's schema, raises DatabaseNotFound.
    """
    store = _store_for(url)
    store.create = create
    return store


def _store_for(url: str) -> base.Store:
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from durably.storage import sqlite

        return sqlite.SqliteStore(url)
    if scheme in {"postgresql", "postgres"}:
        try:
            from durably.storage import postgres
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("psycopg"):
                raise
            raise errors.BackendNotInstalled(
                "a postgresql:// database needs psycopg: pip install 'durably[postgres]'"
            ) from None
        return postgres.PostgresStore(url)
    if "://" not in url:  # a path: `-d app.db`, the first thing a newcomer types
        raise errors.DatabaseURLError(
            f"{url!r} is not a database URL: for a SQLite file write sqlite:///{url} "
            "(three slashes, then the path), or postgresql://user@host/dbname"
        )
    raise errors.DatabaseURLError(
        f"unsupported database URL scheme {scheme!r}: use sqlite:///path/to/file.db "
        "or postgresql://user@host/dbname"
    )
