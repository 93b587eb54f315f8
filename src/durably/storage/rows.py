"""Rows to objects, by column name.

A query's columns are named as the fields of the object they become, so a
reordered or added column cannot shift a value into the wrong field (an unknown
one is a TypeError). Shared by the verb modules of :mod:`durably.storage.sql`.
"""

from __future__ import annotations

from typing import Any

from durably import journal


def names(cursor: Any) -> list[str]:
    """The cursor's column names, lower case.

    psycopg's are read off its result: its ``description`` makes an object per
    column on every call (17 µs for a workflow's row, a tenth of a step's commit).
    """
    result = getattr(cursor, "pgresult", None)
    if result is not None:
        return [bytes(result.fname(i) or b"").decode().lower() for i in range(result.nfields)]
    return [str(column[0]).lower() for column in cursor.description]


def first(cursor: Any) -> dict[str, Any] | None:
    """The cursor's next row by column name, or None."""
    row = cursor.fetchone()
    return None if row is None else dict(zip(names(cursor), row, strict=True))


def every(cursor: Any) -> list[dict[str, Any]]:
    """The cursor's remaining rows by column name."""
    found = cursor.fetchall()
    if not found:
        return []
    columns = names(cursor)
    return [dict(zip(columns, row, strict=True)) for row in found]


def workflow(row: dict[str, Any]) -> journal.WorkflowInfo:
    """A ``workflows`` row as the engine sees it."""
    return journal.WorkflowInfo(**row)


def entry(row: dict[str, Any]) -> journal.Entry:
    """A ``journal`` row as an entry (seq and attempt as ints whatever the driver gave)."""
    row["seq"], row["attempt"] = int(row["seq"]), int(row["attempt"])
    return journal.Entry(**row)
