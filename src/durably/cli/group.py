"""The ``durably`` group and its table of commands: each command's module loads only
when the command runs, shows its own help or has its options completed.

``durably --help`` and the shell's completion of a command name read :data:`COMMANDS`
without importing a command: the command modules and what they import (rich, the
crash kit, the agents' approval code) cost more than the rest of the command line, and
a listing needs none of it.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Callable
from typing import Any

import click
from click import shell_completion

#: Each command: the module that defines it, the attribute that holds it there, and its
#: line in ``durably --help``. A command is found through this table only: a new one is
#: added here (``tests/test_cli_commands.py`` fails on one the modules define and the
#: table does not name).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "approvals": ("durably.agents.cli", "approvals_cmd", "List tool calls waiting for approval."),
    "approve": ("durably.agents.cli", "approve_cmd", "Approve a workflow's pending tool call."),
    "backup": ("durably.admin", "backup_cmd", "Copy a SQLite database while workers run."),
    "bench": ("durably.cli.bench", "bench", "Time durably here, beside a raw commit."),
    "budget": ("durably.agents.cli", "budget_cmd", "Raise the model budget of a parked agent."),
    "cancel": ("durably.cli.workflows", "cancel", "Cancel workflows and their children."),
    "delete": ("durably.cli.selection", "delete_cmd", "Delete workflows and all they wrote."),
    "demo": ("durably.cli.running", "demo", "The refund agent, killed and recovered."),
    "export": ("durably.admin", "export_cmd", "Write workflows to stdout as an archive."),
    "fork": ("durably.cli.workflows", "fork", "Start a copy of a workflow from an entry."),
    "import": ("durably.admin", "import_cmd", "Import an archive from durably export."),
    "list": ("durably.cli.workflows", "list_cmd", "List workflows, newest first, filtered."),
    "migrate": ("durably.cli.workflows", "migrate", "Bring the database schema up to date."),
    "prune": ("durably.admin", "prune_cmd", "Remove old finished workflows."),
    "reject": ("durably.agents.cli", "reject_cmd", "Reject a workflow's pending tool call."),
    "replay": ("durably.cli.replaying", "replay", "Replay recorded workflows on today's code."),
    "resume": ("durably.cli.workflows", "resume", "Run a stopped or queued workflow now."),
    "review": ("durably.cli.review", "review", "The human review queue."),
    "serve": ("durably.cli.running", "serve", "Serve the JSON API and the dashboard."),
    "show": ("durably.cli.workflows", "show", "Show a workflow's receipts."),
    "signal": ("durably.cli.workflows", "signal_cmd", "Send a signal to a workflow."),
    "start": ("durably.cli.workflows", "start", "Start a workflow."),
    "test-crashes": (
        "durably.cli.crashes",
        "test_crashes_command",
        "Kill a workflow at every commit; check it.",
    ),
    "worker": ("durably.cli.running", "worker", "Run workflows until SIGTERM."),
    "workers": ("durably.cli.running", "workers", "List the workers of the database."),
}


class LazyGroup(click.Group):
    """A group that imports a command's module when the command is asked for, and lists
    the commands of :data:`COMMANDS` by their table line without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != cmd_name:
                raise RuntimeError(f"{module}.{attribute} is not the command {cmd_name!r}")
            self.add_command(command)
        found = self.commands.get(cmd_name)
        if found is not None:  # its module is loaded whole by now, a group's commands too
            _take_shared_options(found)
        return found

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(cmd, name)
        entry = COMMANDS.get(name or cmd.name or "")
        if entry is not None and cmd.short_help is None:  # the line the listing shows
            cmd.short_help = entry[2]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if ctx.token_normalize_func is not None:
            name = ctx.token_normalize_func(name)
        known = self.list_commands(ctx)
        if name not in known and not name.startswith("-") and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, known, n=2, cutoff=0.7)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise _NO_SUCH_COMMAND(name, f"No such command {name!r}.{hint}", ctx=ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = ctx.make_formatter().width
        with formatter.section("Commands"):
            formatter.write_dl(self._lines(ctx, "", lambda name: width - 6 - len(name)))

    def shell_complete(
        self, ctx: click.Context, incomplete: str
    ) -> list[shell_completion.CompletionItem]:
        # click's own loads every command for its short help: 0.29 s a <TAB> here
        found = [
            shell_completion.CompletionItem(name, help=line)
            for name, line in self._lines(ctx, incomplete, lambda _: 45)
        ]
        return found + click.Command.shell_complete(self, ctx, incomplete)  # the options

    def _lines(
        self, ctx: click.Context, prefix: str, limit: Callable[[str], int]
    ) -> list[tuple[str, str]]:
        """The visible commands starting with ``prefix`` and their lines, loading none: a
        loaded one's (or one added in code) is its short help cut at ``limit(name)``."""
        lines = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if not name.startswith(prefix) or (command is not None and command.hidden):
                continue
            own = None if command is None else command.get_short_help_str(limit(name))
            lines.append((name, COMMANDS[name][2] if own is None else own))
        return lines


def _database_here(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """A command's own ``--database``: it names the database of this command (and of a
    group's commands), over the one given before the command or in the environment."""
    if value is not None and not ctx.resilient_parsing:
        ctx.obj = value


def _verbose_here(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """A command's own ``--verbose``: what ``durably --verbose`` turns on."""
    if value and not ctx.resilient_parsing:
        logging.getLogger().setLevel(logging.INFO)


#: The group's options a command takes after its name too: their flags, and the rest of
#: each ``click.Option`` (their values go where the group's go, through the callbacks).
_SHARED_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--database", "-d"),
        {
            "default": None,
            "callback": _database_here,
            "help": "Database URL (or DURABLY_DATABASE_URL), here or before the command.",
        },
    ),
    (
        ("-v", "--verbose"),
        {"is_flag": True, "callback": _verbose_here, "help": "Log what the engine does."},
    ),
)


def _take_shared_options(command: click.Command) -> None:
    """Let ``command`` (and a group's commands) take ``--database`` and ``--verbose``
    after its name too: ``durably bench -d postgresql://...`` is what a newcomer types
    first, and click's parser would refuse it as an option of the group alone. Parsed
    by click as the command's own options, so a value that looks like one (``--payload
    -v``) stays the value it is."""
    taken = {opt for param in command.params for opt in param.opts + param.secondary_opts}
    for opts, extra in _SHARED_OPTIONS:
        if taken.isdisjoint(opts):
            command.params.append(click.Option(list(opts), expose_value=False, **extra))
    if isinstance(command, click.Group):
        for inner in command.commands.values():
            _take_shared_options(inner)


def _no_such_command(name: str, message: str, ctx: click.Context) -> click.UsageError:
    """click's error for an unknown command before 8.2 gave it a class of its own."""
    return click.UsageError(message, ctx)


#: The error for an unknown command: click's ``NoSuchCommand`` (8.2 on), which callers
#: may catch, given our message; else a plain ``UsageError``.
_NO_SUCH_COMMAND: Callable[..., click.UsageError] = getattr(
    click.exceptions, "NoSuchCommand", _no_such_command
)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the installed version, read only when asked (``durably.__version__``
    reads the package metadata, which every other command would pay for at start)."""
    if value and not ctx.resilient_parsing:
        import durably

        click.echo(f"durably {durably.__version__}")
        ctx.exit()


@click.group(cls=LazyGroup)
@click.option(
    "--database",
    "-d",
    envvar="DURABLY_DATABASE_URL",
    default="sqlite:///durably.db",
    show_default=True,
    help="Database URL (or DURABLY_DATABASE_URL).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log what the engine does.")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.pass_context
def main(ctx: click.Context, database: str, verbose: bool) -> None:
    """durably: durable execution for AI agents."""
    ctx.obj = database
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
