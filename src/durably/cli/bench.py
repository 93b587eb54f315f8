"""``durably bench``: what durably costs on this machine and database, beside a raw commit.

The work is :mod:`durably.bench`; this is its command line.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import signal
import sqlite3
import sys

import click

import durably
from durably.cli.base import _fail, _say


@click.command("bench")
@click.option("--rounds", type=click.IntRange(1, 50), default=None, help="Rounds (default 3).")
@click.option("--quick", is_flag=True, help="Small sizes, 2 rounds: a few seconds.")
@click.option(
    "--rows",
    "wanted",
    default="",
    metavar="NAMES",
    help="Only these rows, comma-separated names or prefixes "
    "(step, step-sync, tp1-1, tp1-10, tp1-100, replay, signal, recovery, procs-2, "
    "procs-4).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, not the table.")
@click.pass_obj
def bench(database: str, rounds: int | None, quick: bool, wanted: str, as_json: bool) -> None:
    """Time durably on this machine and the --database's disk or server.

    Each figure stands beside a baseline measured in the same run: a raw commit of the
    same database, the async step for a def step, one worker process for several. It
    measures in scratch files beside a SQLite database (or scratch schemas of a
    PostgreSQL one) and removes them; the database's own data is never read or
    written. About a minute on a quick disk or server.
    """
    from dataclasses import replace

    from durably.bench import report

    sizes = report.QUICK if quick else report.DEFAULT
    if rounds is not None:
        sizes = replace(sizes, rounds=rounds)
    try:
        names = [name.strip() for name in wanted.split(",") if name.strip()]
        rows = report.select(report.make_rows(sizes), names)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--rows'") from None

    left: list[str] = []  # what could not be removed, as the run said

    def progress(line: str) -> None:
        click.echo(line, err=True)

    def warn(line: str) -> None:
        left.append(line)
        progress(line)

    def stop(_signum: int, _frame: object) -> None:  # SIGTERM ends a run as Ctrl-C does
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        done = asyncio.run(report.run(database, sizes, rows, progress, warn))
    except durably.DurablyError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        if not left:
            progress("interrupted: the scratch databases are removed")
        sys.exit(130)
    except _FAILURES as exc:  # the database or the disk failed mid-run: said, not a traceback
        _fail(RuntimeError(f"durably bench stopped: {type(exc).__name__}: {exc}"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(report.as_json(done), indent=2))
    else:
        for line in report.table(done):
            _say(line)


#: What a run may meet from the database or the disk beside durably's own errors: the
#: baseline's drivers (psycopg's errors are OSError-free, so named when it is installed),
#: a workload that timed out or found the engine not doing what it times.
_FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    sqlite3.Error,
    TimeoutError,
    RuntimeError,
    *((importlib.import_module("psycopg").Error,) if importlib.util.find_spec("psycopg") else ()),
)
