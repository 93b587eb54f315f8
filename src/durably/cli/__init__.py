"""The ``durably`` command line: list, show, start, worker, serve, signal, cancel, resume,
fork, delete, migrate, demo, replay, and the rest ``durably --help`` lists.

It uses only the public API: a Client to read and start, an Engine to run.
The database comes from ``--database``, else ``DURABLY_DATABASE_URL``, else
``sqlite:///durably.db``.

The commands live in the modules of this package (``workflows``, ``running``,
``review``, ``crashes``, ``replaying``, ``selection``: the filters and ``delete``), in
``durably.agents.cli`` (approvals, budgets) and in ``durably.admin`` (export, import,
prune, backup). :data:`main`, the group in ``group``, names each in its table and
imports its module only when the command is used.
"""

from durably.cli.group import main

__all__ = ["main"]
