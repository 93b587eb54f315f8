"""The archive format: whole workflows as JSON lines, for ``durably export`` and ``import``.

An archive is UTF-8 text, one JSON object per line (docs/operations.md):

1. a header: ``{"durably_archive": 1, "durably": "0.1.0", "schema": 4, ...}``, the
   format version (:data:`FORMAT`) first;
2. one line per workflow: ``{"workflow": {column: value}, "journal": [...],
   "claims": [...], "signals": [...], "events": [...], "reviews": [...]}``, each
   row an object of its table's columns (:data:`durably.storage.bulk.COLUMNS`),
   values as stored (text, integers, floats, null);
3. an end line ``{"end": N}`` counting the workflow lines, so an archive cut short
   at a line boundary is refused too.

Reading checks every line before anything is imported, and refuses the first
bad one with its line number.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from durably import errors
from durably.storage import bulk

#: The archive format version written in the header; reading refuses a newer one.
FORMAT = 1

_SIDE_TABLES = tuple(t for t in bulk.COLUMNS if t != "workflows")


def header(durably_version: str, schema: int) -> dict[str, Any]:
    """The first line of an archive written now."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {"durably_archive": FORMAT, "durably": durably_version, "schema": schema,
            "exported_at": now}  # fmt: skip


def write(out: IO[str], head: dict[str, Any], workflows: Iterable[bulk.ArchivedWorkflow]) -> int:
    """Write a whole archive: the header, one line per workflow, the end line.

    Returns how many workflows were written.
    """
    out.write(_line(head))
    count = 0
    for wf in workflows:
        record: dict[str, Any] = {"workflow": wf.rows["workflows"][0]}
        record.update({table: wf.rows[table] for table in _SIDE_TABLES})
        out.write(_line(record))
        count += 1
    out.write(_line({"end": count}))
    return count


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


def read(lines: Iterable[str], name: str) -> tuple[dict[str, Any], list[bulk.ArchivedWorkflow]]:
    """The header and the workflows of an archive, every line checked.

    Raises ArchiveError naming ``name`` and the line of the first problem: not
    JSON (a corrupt or cut line), a missing or newer header, a row whose columns
    or values do not fit, a missing end line (the archive was cut short).
    """
    head: dict[str, Any] | None = None
    found: list[bulk.ArchivedWorkflow] = []
    ended = False
    number = 0
    for number, obj in _objects(lines, name):
        where = f"{name} line {number}"
        if ended:
            raise errors.ArchiveError(f"{where}: text after the end line")
        if head is None:
            head = _header(obj, where)
        elif set(obj) == {"end"}:
            if obj["end"] != len(found):
                raise errors.ArchiveError(
                    f"{where}: the end line counts {obj['end']!r} workflows but "
                    f"{len(found)} were read"
                )
            ended = True
        else:
            found.append(_workflow(obj, where))
    if head is None:
        raise errors.ArchiveError(f"{name} is empty: not a durably archive")
    if not ended:
        raise errors.ArchiveError(
            f"{name} line {number}: the archive ends without its end line: it was cut "
            "short (truncated); nothing was imported"
        )
    ids = [wf.workflow_id for wf in found]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise errors.ArchiveError(f"{name}: workflow {dup!r} appears twice")
    return head, found


def _objects(lines: Iterable[str], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, text in enumerate(lines, 1):
        if not text.strip():
            raise errors.ArchiveError(f"{name} line {number}: empty line")
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:
            raise errors.ArchiveError(
                f"{name} line {number}: not a JSON object ({exc}): the line is corrupt or "
                "cut short; nothing was imported"
            ) from None
        if not isinstance(obj, dict):
            raise errors.ArchiveError(f"{name} line {number}: not a JSON object")
        yield number, obj


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a value an archive holds")


def _header(obj: dict[str, Any], where: str) -> dict[str, Any]:
    version = obj.get("durably_archive")
    if not isinstance(version, int) or isinstance(version, bool):
        raise errors.ArchiveError(
            f"{where}: no durably_archive header: not a durably archive (it begins with "
            f"{', '.join(list(obj)[:3]) or 'an empty object'})"
        )
    if version > FORMAT:
        raise errors.ArchiveError(
            f"{where}: archive format {version} (written by durably {obj.get('durably')}) "
            f"is newer than this durably reads ({FORMAT}); upgrade durably"
        )
    return obj


def _workflow(obj: dict[str, Any], where: str) -> bulk.ArchivedWorkflow:
    expected = {"workflow", *_SIDE_TABLES}
    if set(obj) != expected:
        extra = sorted(set(obj) - expected)
        missing = sorted(expected - set(obj))
        raise errors.ArchiveError(
            f"{where}: a workflow line has "
            + (f"unknown keys {extra}" if extra else f"no {missing}")
        )
    row = _row(obj["workflow"], "workflows", where)
    wid = row["workflow_id"]
    if not isinstance(wid, str):
        raise errors.ArchiveError(f"{where}: workflow_id is {wid!r}, not text")
    rows: dict[str, list[dict[str, Any]]] = {"workflows": [row]}
    for table in _SIDE_TABLES:
        if not isinstance(obj[table], list):
            raise errors.ArchiveError(f"{where}: {table} is not a list of rows")
        rows[table] = [_row(r, table, where) for r in obj[table]]
        strays = {r["workflow_id"] for r in rows[table]} - {wid}
        if strays:
            raise errors.ArchiveError(
                f"{where}: {table} rows of workflow {sorted(map(str, strays))[0]!r} "
                f"in the line of workflow {wid!r}"
            )
    return bulk.ArchivedWorkflow(rows, where)


def _row(given: Any, table: str, where: str) -> dict[str, Any]:
    columns = bulk.COLUMNS[table]
    if not isinstance(given, dict):
        raise errors.ArchiveError(f"{where}: a {table} row is not an object")
    later = bulk.LATER_COLUMNS.get(table, frozenset())
    value: dict[str, Any] = {**dict.fromkeys(later - set(given)), **given}
    if set(value) != set(columns):
        extra = sorted(set(value) - set(columns))
        missing = sorted(set(columns) - set(value))
        raise errors.ArchiveError(
            f"{where}: a {table} row has "
            + (f"unknown columns {extra} (an archive of a newer schema?)" if extra else "")
            + (" and " if extra and missing else "")
            + (f"no {missing}" if missing else "")
        )
    for column, v in value.items():
        if isinstance(v, bool) or not isinstance(v, str | int | float | None):
            raise errors.ArchiveError(
                f"{where}: {table}.{column} is {type(v).__name__}; a stored value is text, "
                "a number or null"
            )
    return value
