"""The ``durably`` command line: list, show, start, worker, serve, signal, cancel, resume,
fork, delete, migrate, demo, replay.

It uses only the public API: a Client to read and start, an Engine to run.
The database comes from ``--database``, else ``DURABLY_DATABASE_URL``, else
``sqlite:///durably.db``.

The commands live in the modules of this package (``workflows``, ``running``,
``review``, ``crashes``, ``selection``: the filters and ``delete``) and register on
:data:`main`, the group defined in ``base``; the agents' approval commands and the
operations commands (``admin``) are added here.
"""

from durably import admin
from durably.agents import cli as agents_cli
from durably.cli import crashes, replaying, review, running, selection, workflows
from durably.cli.base import main

__all__ = ["main"]

_COMMAND_MODULES = (replaying, review, running, workflows)  # their commands registered on import

main.add_command(crashes.test_crashes_command)
main.add_command(agents_cli.approvals_cmd)
main.add_command(agents_cli.approve_cmd)
main.add_command(agents_cli.reject_cmd)
for _command in admin.COMMANDS:  # export, import, prune, backup (docs/operations.md)
    main.add_command(_command)
main.add_command(agents_cli.budget_cmd)
main.add_command(selection.delete_cmd)
