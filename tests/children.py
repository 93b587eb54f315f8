"""One way to start a child process in the tests: its environment and its command line.

Every test that spawns a process (a worker, a crash runner, the CLI, a fake
service) builds its environment here, so that all of them agree on what a child
inherits: our environment without durably's own variables (no crash plan, no
database URL leaking in from the test run: ``DURABLY_*`` is dropped unless the
caller keeps it), with the repository and ``src`` importable first, and then
what the caller adds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def child_env(
    extra: Mapping[str, str] | None = None,
    *,
    drop: Sequence[str] = ("DURABLY_",),
    paths: Sequence[str | os.PathLike[str]] | None = None,
) -> dict[str, str]:
    """Our environment for a child: variables starting with any of ``drop`` removed, the
    repository and ``src`` first on PYTHONPATH (then ours), then ``extra``.

    ``paths`` replaces the whole PYTHONPATH (a docs block imports only what it wrote).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}
    if paths is None:
        ours = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        paths = [str(REPO), str(SRC), *ours]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(str(p) for p in paths))
    env.update(extra or {})
    return env


def python(*argv: str) -> list[str]:
    """The command line running this Python with ``argv``."""
    return [sys.executable, *argv]


def durably_cli(database: str, *argv: str) -> list[str]:
    """The command line of ``durably --database DATABASE ARGV...``."""
    return python("-m", "durably.cli", "--database", database, *argv)
