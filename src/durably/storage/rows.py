"""Rows to objects, by column name.

A query's columns are named as the fields of the object they become, so a
reordered or added column cannot shift a value into the wrong field (an unknown
one is a TypeError). Shared by the verb modules of :mod:`durably.storage.sql`.
"""

from __future__ import annotations

from typing import Any

from durably import journal

#: Column names, lower case, by the driver's raw names: a query's columns are the same
#: at every run, so each set is decoded once (a bound keeps odd queries from growing it).
_NAMES: dict[Any, tuple[str, ...]] = {}
_NAMES_KEPT = 512


def names(cursor: Any) -> tuple[str, ...]:
    """The cursor's column names, lower case.

    psycopg's are read off its result: its ``description`` makes an object per
    column on every call (17 µs for a workflow's row, a tenth of a step's commit);
    decoding each name again was 10 µs more, so each set is decoded once.
    """
    result = getattr(cursor, "pgresult", None)
    if result is not None:
        key: Any = tuple(map(result.fname, range(result.nfields)))
    else:
        key = cursor.description
    found = _NAMES.get(key)
    if found is None:
        if result is not None:
            found = tuple(bytes(name or b"").decode().lower() for name in key)
        else:
            found = tuple(str(column[0]).lower() for column in key)
        if len(_NAMES) >= _NAMES_KEPT:
            _NAMES.clear()
        _NAMES[key] = found
    return found


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
