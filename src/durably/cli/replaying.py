"""``durably replay``: today's code against recorded journals, the check before a deploy."""

from __future__ import annotations

import asyncio
import sys

import click

from durably import errors, journal, rehearsal
from durably.cli.base import _import, main


@main.command()
@click.argument("archive", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--app",
    "modules",
    multiple=True,
    required=True,
    help="Import this module (today's code: its workflows and steps); repeatable.",
)
@click.option(
    "--status",
    type=click.Choice([s.value for s in journal.Status]),
    default=None,
    help="Without ARCHIVE: only the database's workflows of this status.",
)
@click.option(
    "--strict-replay",
    is_flag=True,
    help="A step called with other arguments is a problem (as Engine(strict_replay=True)).",
)
@click.pass_obj
def replay(
    database: str, archive: str | None, modules: tuple[str, ...], status: str | None,
    strict_replay: bool,
) -> None:  # fmt: skip
    """Replay recorded workflows against today's code (the modules given with --app),
    with no side effect: no step runs, nothing is written, no model is called.

    ARCHIVE is a file written by ``durably export``; without it, the workflows of
    the database (--database, filtered by --status). Prints each problem with its
    seq and source line and exits 1 if there is any: a divergence, a recorded
    value that no longer decodes, an error where the recorded run did not fail.
    """
    if archive is not None and status is not None:
        raise click.UsageError("--status selects from the database; give it without ARCHIVE")
    for module in modules:
        _import(module)
    try:
        if archive is not None:
            recorded = rehearsal.from_archive(archive)
            source = archive
        else:
            recorded = rehearsal.from_database(database, status)
            source = database
    except OSError as exc:
        raise click.FileError(str(archive), exc.strerror) from None
    except UnicodeDecodeError as exc:
        click.echo(f"error: {archive} is not UTF-8 text ({exc}): not a durably archive", err=True)
        sys.exit(1)
    except errors.DurablyError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    report = asyncio.run(rehearsal.rehearse(recorded, strict_replay=strict_replay))
    for warning in report.warnings:
        click.echo(f"warning: {warning.line()}")
    for problem in report.problems:
        click.echo(f"problem: {problem.line()}")
    click.echo(
        f"replayed {len(report.replayed)} workflow(s) of {source} against "
        f"{', '.join(modules)}: {len(report.problems)} problem(s), "
        f"{len(report.warnings)} warning(s)"
    )
    if not report.ok:
        sys.exit(1)
