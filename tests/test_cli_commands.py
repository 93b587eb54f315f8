"""The ``durably`` group's table of commands: every command is in it under its own name,
the listing fits 80 columns from the table alone, and a typo names the command meant.

The commands themselves are tested in test_cli.py and beside their features; here is
the group that finds them. What ``durably --help`` imports is checked in a fresh
interpreter by test_import_laziness.py.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import durably
from durably import cli
from durably.cli import group
from tests import children


def _defined(module_name: str) -> dict[str, click.Command]:
    """The commands a module defines, by command name, but a group's own (``review
    resolve``)."""
    found = [v for v in vars(importlib.import_module(module_name)).values()]
    commands = [v for v in found if isinstance(v, click.Command) and v is not cli.main]
    inner = {id(c) for g in commands if isinstance(g, click.Group) for c in g.commands.values()}
    return {str(c.name): c for c in commands if id(c) not in inner}


def test_every_command_the_modules_define_is_in_the_table_under_its_own_name() -> None:
    # the table's modules and every module of the command line's package: a command in a
    # new module that the table does not name would be one `durably` never finds
    package = [f"durably.cli.{m.name}" for m in pkgutil.iter_modules(cli.__path__)]
    package.remove("durably.cli.__main__")  # it runs the command line when imported
    modules = {module for module, _, _ in group.COMMANDS.values()} | set(package)
    defined: dict[str, click.Command] = {}
    for module in sorted(modules):
        defined.update(_defined(module))
    assert sorted(defined) == sorted(group.COMMANDS)
    ctx = click.Context(cli.main)
    for name, (module, attribute, line) in group.COMMANDS.items():
        command = cli.main.get_command(ctx, name)
        assert command is defined[name], f"{name}: {module}.{attribute}"
        assert command.name == name
        assert command.get_short_help_str() == line  # completion shows the listing's line


def test_the_listing_names_every_command_on_one_line_of_80_columns() -> None:
    result = CliRunner().invoke(cli.main, ["--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    listed = lines[lines.index("Commands:") + 1 :]
    assert [line.split()[0] for line in listed] == sorted(group.COMMANDS)
    for line in listed:
        name, text = line.split(maxsplit=1)
        assert text == group.COMMANDS[name][2]


def test_a_command_shows_its_whole_help_of_its_own() -> None:
    result = CliRunner().invoke(cli.main, ["list", "--help"])
    assert result.exit_code == 0, result.output
    assert "List workflows, newest first (--order asc: oldest first), filtered." in result.output
    assert "--status" in result.output


@pytest.mark.parametrize(
    ("typed", "hint"),
    [("lst", "Did you mean 'list'?"), ("worekr", "Did you mean 'worker' or 'workers'?")],
)
def test_a_mistyped_command_names_the_one_meant(typed: str, hint: str) -> None:
    result = CliRunner().invoke(cli.main, [typed])
    assert result.exit_code == 2
    assert f"No such command {typed!r}. {hint}" in result.output


def test_an_unknown_command_with_nothing_close_says_so_alone() -> None:
    result = CliRunner().invoke(cli.main, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'." in result.output
    assert "Did you mean" not in result.output


def test_a_table_entry_that_names_the_wrong_object_is_an_error_naming_it() -> None:
    broken = group.LazyGroup(name="broken")
    saved = dict(group.COMMANDS)
    group.COMMANDS["ghost"] = ("durably.cli.workflows", "list_cmd", "Not list.")
    try:
        with pytest.raises(RuntimeError, match=r"durably\.cli\.workflows\.list_cmd .*'ghost'"):
            broken.get_command(click.Context(broken), "ghost")
    finally:
        group.COMMANDS.clear()
        group.COMMANDS.update(saved)


def test_shell_completion_offers_the_commands_with_their_lines() -> None:
    env = {"_DURABLY_COMPLETE": "zsh_complete", "COMP_WORDS": "durably wor", "COMP_CWORD": "1"}
    result = CliRunner().invoke(cli.main, [], prog_name="durably", env=env)
    assert result.exit_code == 0, result.output
    assert result.output.split("\n") == [
        "plain", "worker", group.COMMANDS["worker"][2],
        "plain", "workers", group.COMMANDS["workers"][2], "",
    ]  # fmt: skip


def test_the_error_for_an_unknown_command_is_clicks_own() -> None:
    expected = getattr(click.exceptions, "NoSuchCommand", click.UsageError)
    with pytest.raises(expected, match=r"No such command 'lst'\. Did you mean 'list'\?"):
        cli.main.main(["lst"], standalone_mode=False)


def test_a_command_added_in_code_is_listed_by_its_own_line_unless_hidden() -> None:
    extra = group.LazyGroup(name="durably")

    @extra.command("hello")
    def hello() -> None:
        """Say hello to whoever runs it, at length."""

    @extra.command("secret", hidden=True)
    def secret() -> None:
        """Not listed."""

    shown = CliRunner().invoke(extra, ["--help"], env={"COLUMNS": "80"}).output
    assert "  hello         Say hello to whoever runs it, at length." in shown
    assert "secret" not in shown
    assert "  list          " + group.COMMANDS["list"][2] in shown


def test_every_command_takes_the_database_and_verbose_after_its_name_too() -> None:
    # `durably bench -d postgresql://...` is what a newcomer types first
    ctx = click.Context(cli.main)

    def check(command: click.Command, path: str) -> None:
        opts = {opt for param in command.params for opt in param.opts}
        assert {"-d", "--database", "-v", "--verbose"} <= opts, path
        for name, inner in getattr(command, "commands", {}).items():
            check(inner, f"{path} {name}")

    for name in group.COMMANDS:
        command = cli.main.get_command(ctx, name)
        assert command is not None
        check(command, name)


@durably.workflow(name="cli_commands_echo")
async def _echo(text: str) -> str:
    return text


def test_a_database_given_after_the_command_is_the_one_it_reads(tmp_path: Path) -> None:
    full, empty = f"sqlite:///{tmp_path / 'full.db'}", f"sqlite:///{tmp_path / 'empty.db'}"

    async def make() -> str:
        async with durably.Engine(empty):
            pass
        async with durably.Engine(full) as engine:
            handle = await engine.start(_echo, "hello")
            await handle.result()
            return handle.workflow_id

    workflow_id = asyncio.run(make())

    def listed(*args: str) -> str:
        result = CliRunner().invoke(cli.main, list(args), env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return result.output

    assert workflow_id in listed("list", "-d", full)
    assert workflow_id in listed("list", f"--database={full}", "--json")
    assert workflow_id in listed("-d", empty, "list", "-d", full)  # the command's own wins
    assert workflow_id not in listed("-d", full, "list", "-d", empty)
    assert workflow_id in listed("-d", full, "list")  # before the command, as always
    assert workflow_id in listed("show", workflow_id, "-d", full)
    assert (
        "no SQLite database"
        in CliRunner()
        .invoke(cli.main, ["review", "list", "-d", f"sqlite:///{tmp_path / 'none.db'}"])
        .output
    )
    assert CliRunner().invoke(cli.main, ["review", "-d", full, "list"]).exit_code == 0


@pytest.mark.parametrize("module", ["durably", "durably.cli", "durably.agents"])
def test_python_dash_m_runs_the_command_line(module: str, tmp_path: Path) -> None:
    """`python -m durably` is what a newcomer without the script on PATH types (before:
    "No module named durably.__main__")."""
    done = subprocess.run(
        [sys.executable, "-m", module, "lst"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=children.child_env(),
        timeout=60,
    )
    assert done.returncode == 2, done
    assert f"Usage: python -m {module} [OPTIONS] COMMAND" in done.stderr, done.stderr
    assert "No such command 'lst'. Did you mean 'list'?" in done.stderr, done.stderr
