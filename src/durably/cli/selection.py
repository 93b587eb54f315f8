"""Selecting workflows on the command line: the filters ``list``, ``cancel``, ``resume``
and ``delete`` share, and the ``delete`` command.

Each filter is an option that maps to one keyword of ``Client.list_workflows`` (and of
the bulk calls ``cancel_workflows``, ``resume_workflows``, ``delete_workflows``), so
the command line selects exactly what the API does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

import durably
from durably import admin, journal
from durably.cli.base import _fail

F = TypeVar("F", bound=Callable[..., Any])


def filter_options(fn: F) -> F:
    """Add the filter options (--status, --name, --id, --prefix, --parent, --queue,
    --since, --until) to a command; it receives them as keywords of the same names."""
    options = [
        click.option("--status", type=click.Choice([s.value for s in journal.Status])),
        click.option("--name", default=None, help="Only workflows of this name."),
        click.option("--id", "ids", multiple=True, help="Only this id (repeat for several)."),
        click.option("--prefix", default=None, help="Only ids starting with this."),
        click.option("--parent", default=None, help="Only children of this workflow."),
        click.option("--queue", default=None, help="Only workflows of this queue."),
        click.option("--since", default=None, help="Created at or after (date or age: 2h)."),
        click.option("--until", default=None, help="Created before (date or age: 30d)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def filters(
    status: str | None,
    name: str | None,
    ids: tuple[str, ...],
    prefix: str | None,
    parent: str | None,
    queue: str | None,
    since: str | None,
    until: str | None,
) -> dict[str, Any]:
    """The keywords of ``list_workflows`` for the options given (None for the others)."""
    return {
        "status": status,
        "name": name,
        "ids": list(ids) if ids else None,
        "id_prefix": prefix,
        "parent_id": parent,
        "queue": queue,
        "created_after": admin.parse_when(since, "--since") if since else None,
        "created_before": admin.parse_when(until, "--until") if until else None,
    }


def selected(chosen: dict[str, Any]) -> bool:
    """Whether any filter was given."""
    return any(v is not None for v in chosen.values())


@click.command("delete")
@click.argument("workflow_ids", nargs=-1)
@filter_options
@click.option("--force", is_flag=True, help="Delete unfinished workflows too.")
@click.pass_obj
def delete_cmd(
    database: str, /, workflow_ids: tuple[str, ...], force: bool, **options: Any
) -> None:
    """Delete workflows (by id, or every one the filters select) with their children,
    journals and every row naming them: all or none. An unfinished one is refused
    unless --force (cancel it first)."""
    chosen = filters(**options)
    if not workflow_ids and not selected(chosen):
        raise click.UsageError("give a workflow ID or a filter (--status, --prefix, ...)")
    by_id = not selected(chosen)  # ids alone: each must exist
    if workflow_ids:
        chosen["ids"] = [*workflow_ids, *(chosen["ids"] or [])]
    try:
        with durably.Client(database, create=False) as client:
            if by_id:
                deleted = client.delete(*workflow_ids, force=force)
            else:
                deleted = client.delete_workflows(force=force, **chosen)
    except durably.WorkflowNotFinished as exc:
        _fail(durably.WorkflowNotFinished(f"{exc} (--force deletes it anyway)"))
    except durably.DurablyError as exc:
        _fail(exc)
    for wid in deleted:
        click.echo(wid)
