"""What every command of the ``durably`` command line shares: the ``main`` group (from
``group``), the console, and the helpers that open a Client, print user text and parse
arguments."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.text import Text

import durably
from durably.cli.group import main as main  # where the commands register

console = Console(highlight=False)
#: Where errors go: stderr, so that stdout holds only what a command prints (its JSON).
errors = Console(highlight=False, stderr=True)

#: A duration in seconds that must be more than zero (a lease, a poll, a timeout).
SECONDS = click.FloatRange(min=0, min_open=True)


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "diverged": "red",
    "cancelled": "yellow",
    "needs_review": "magenta",
    "running": "cyan",
}


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _age(seconds: float) -> str:
    """How long ago, in the largest unit that fits: ``42s``, ``7m``, ``3h``, ``12d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _short_when(ts: float | None, now: float) -> str:
    """A compact time for a table column: the time alone today, else month and day too."""
    if ts is None:
        return ""
    when = datetime.datetime.fromtimestamp(ts)
    if when.date() == datetime.datetime.fromtimestamp(now).date():
        return when.strftime("%H:%M:%S")
    if when.year == datetime.datetime.fromtimestamp(now).year:
        return when.strftime("%b %d %H:%M")
    return when.strftime("%Y-%m-%d")


def _status(status: str) -> Text:
    """A workflow status, coloured (a style never comes from user text)."""
    return Text(status, style=_STATUS_STYLE.get(status, ""))


def _fail(exc: Exception) -> NoReturn:
    # Messages name ids, steps and values: user text, printed as it is (never as markup).
    errors.print(Text.assemble(("error:", "red"), " ", str(exc), _begun(exc)), soft_wrap=True)
    sys.exit(1)


def _begun(exc: Exception) -> str:
    """For a WORKFLOW_ID not found, the ids that begin with it (a newcomer types an id
    short, as git takes it): named, never taken in its place."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or not isinstance(exc, durably.WorkflowNotFound):
        return ""
    typed = ctx.params.get("workflow_id")
    if not isinstance(typed, str) or not typed:
        return ""
    try:
        with durably.Client(ctx.obj, create=False) as client:
            found = client.list_workflows(id_prefix=typed, order="asc", limit=6)
    except durably.DurablyError:
        return ""
    ids = [info.workflow_id for info in found]
    if not ids:
        return ""
    return f"; ids that begin with it: {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}"


def _say(text: str) -> None:
    """Print a line that holds user text (ids, names, values) exactly, never as markup."""
    console.print(text, markup=False, soft_wrap=True)


@contextlib.contextmanager
def _client(database: str, *, create: bool = True) -> Iterator[durably.Client]:
    """A Client for one command; a durably error ends the command with its message.

    Commands that only read, or act on workflows that must already exist, pass
    ``create=False``: a mistyped path is then an error, not a new empty database.
    """
    try:
        with durably.Client(database, create=create) as client:
            yield client
    except durably.DurablyError as exc:
        _fail(exc)


def _import(module: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise click.ClickException(f"cannot import {module!r}: {exc}") from exc


def parse_args_json(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments from JSON: a list is positional, an object keywords, anything else one value."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"ARGS_JSON is not JSON: {exc}") from exc
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    return [value], {}


def _json_lines(records: Iterable[dict[str, Any]]) -> None:
    """Print one JSON object per line, keys sorted: the stable form scripts read."""
    for record in records:
        click.echo(json.dumps(record, sort_keys=True, default=str))
