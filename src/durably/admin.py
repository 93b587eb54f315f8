"""The operator's commands on a whole database: export, import, prune, backup.

Registered on the ``durably`` group by :mod:`durably.cli`; the database comes
from its ``--database``. See docs/operations.md.
"""

from __future__ import annotations

import datetime
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click

import durably
from durably import archive, errors, journal
from durably.storage import bulk, create_store, thread

R = TypeVar("R")

#: Workflows read per transaction by export, and removed per transaction by prune.
BATCH = 200

_AGO = re.compile(r"(\d+)([dhm])")
_UNIT = {"d": 86400, "h": 3600, "m": 60}


def parse_when(text: str, option: str, now: float | None = None) -> float:
    """A time given as an ISO date or date-time (UTC unless it says otherwise), or as an
    age: ``30d``, ``12h``, ``45m`` ago."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        return (time.time() if now is None else now) - int(ago.group(1)) * _UNIT[ago.group(2)]
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a date: give 2026-11-01, 2026-11-01T12:00:00+00:00 or an age "
            "such as 30d, 12h, 45m",
            param_hint=option,
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _fail(exc: Exception) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


class _Session:
    """The database's store, on its thread, for one command.

    ``create=False`` where the command reads a database that must exist (export, prune,
    backup): a mistyped path is then an error, not a new empty database.
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.thread = thread.StoreThread(create_store(url, create=create))
        self.store = self.thread.store

    def __enter__(self) -> _Session:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.thread.stop()

    def call(self, fn: Callable[..., R], *args: Any, write: bool = False) -> R:
        return self.thread.call_sync(fn, *args, write=write)


@click.command("export")
@click.argument("workflow_ids", nargs=-1)
@click.option("--status", type=click.Choice([s.value for s in journal.Status]), default=None)
@click.option("--since", default=None, help="Only workflows created at or after this date.")
@click.pass_obj
def export_cmd(database: str, workflow_ids: tuple[str, ...], status: str | None,
               since: str | None) -> None:  # fmt: skip
    """Write workflows (default: all) with every row that names them, and their children,
    to stdout as an archive (JSON lines)."""
    if workflow_ids and (status or since):
        raise click.UsageError("give workflow ids, or --status/--since, not both")
    start = parse_when(since, "--since") if since else None
    try:
        with _Session(database, create=False) as db:
            ids = list(workflow_ids) or db.call(db.store.export_ids, status, start)
            head = archive.header(durably.__version__, db.call(db.store.schema_version))
            count = archive.write(sys.stdout, head, _exported(db, ids))
    except errors.DurablyError as exc:
        _fail(exc)
    click.echo(f"exported {count} workflow(s)", err=True)


def _exported(db: _Session, ids: list[str]) -> Iterator[bulk.ArchivedWorkflow]:
    seen: set[str] = set()
    for i in range(0, len(ids), BATCH):
        for wf in db.call(db.store.export_workflows, ids[i : i + BATCH]):
            if wf.workflow_id not in seen:  # a child comes with its parent, once
                seen.add(wf.workflow_id)
                yield wf


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.pass_obj
def import_cmd(database: str, path: str) -> None:
    """Import an archive written by ``durably export`` (``-``: stdin): all of it in one
    transaction, or nothing. A workflow id already in the database refuses the import."""
    try:
        with click.open_file(path, encoding="utf-8") as f:
            _, workflows = archive.read(f, "stdin" if path == "-" else path)
    except OSError as exc:
        raise click.FileError(path, exc.strerror) from None
    except UnicodeDecodeError as exc:
        _fail(errors.ArchiveError(f"{path} is not UTF-8 text ({exc}): not a durably archive"))
    except errors.DurablyError as exc:
        _fail(exc)
    try:
        with _Session(database) as db:
            imported = db.call(db.store.import_workflows, workflows, write=True)
    except errors.DurablyError as exc:
        _fail(exc)
    click.echo(f"imported {len(imported)} workflow(s)")


@click.command("prune")
@click.option(
    "--finished-before",
    "before",
    required=True,
    help="Remove workflows finished before this date (or age: 30d).",
)
@click.option(
    "--status",
    type=click.Choice(journal.FINISHED_STATUSES),
    default=None,
    help="Only workflows that ended so.",
)
@click.pass_obj
def prune_cmd(database: str, before: str, status: str | None) -> None:  # fmt: skip
    """Remove finished workflows with their journals, in small transactions.

    Never an unfinished workflow, nor a child while its parent is kept, nor a parent
    while a child of it is unfinished.
    """
    cutoff = parse_when(before, "--finished-before")
    total = 0
    try:
        with _Session(database, create=False) as db:
            while True:
                pruned = db.call(db.store.prune, cutoff, status, BATCH, write=True)
                total += len(pruned)
                if len(pruned) < BATCH:
                    break
    except errors.DurablyError as exc:
        _fail(exc)
    click.echo(f"pruned {total} workflow(s)")


@click.command("backup")
@click.argument("path", type=click.Path(dir_okay=False))
@click.pass_obj
def backup_cmd(database: str, path: str) -> None:
    """Copy a SQLite database to the new file PATH while workers run (PostgreSQL: prints
    the procedure)."""
    try:
        with _Session(database, create=False) as db:
            db.thread.call_sync(db.store.backup, path, _raw=True)
    except errors.DurablyError as exc:
        _fail(exc)
    click.echo(f"backed up {db.store.url} to {path}")


COMMANDS = (export_cmd, import_cmd, prune_cmd, backup_cmd)
