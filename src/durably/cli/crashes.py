"""``durably test-crashes``: kill a workflow at every commit boundary and judge each recovery.

The work is :func:`durably.testing.crash_points`; this is its command line.
"""

from __future__ import annotations

import os
import sys

import click
from rich.console import Console

from durably.cli import base
from durably.testing import crashes


@click.command("test-crashes")
@click.argument("target")
@click.argument("args_json", default="[]")
@click.option(
    "--effects-log",
    default=None,
    help="JSONL log your service writes, one line per request with an idempotency_key "
    "(relative: inside each scenario's DURABLY_SCENARIO_DIR).",
)
@click.option(
    "--workdir", type=click.Path(file_okay=False), default=None, help="Keep scenarios here."
)
@click.option(
    "--timeout", type=base.SECONDS, default=60.0, show_default=True, help="Seconds per process."
)
@click.option(
    "--only",
    multiple=True,
    help="Only boundaries matching this shell pattern, e.g. '*:issue_refund@*' (repeatable).",
)
def test_crashes_command(
    target: str,
    args_json: str,
    effects_log: str | None,
    workdir: str | None,
    timeout: float,
    only: tuple[str, ...],
) -> None:
    """Kill MODULE:WORKFLOW at every commit boundary, recover it, and check its side effects.

    ARGS_JSON is a list of arguments or an object of keywords. Exits 1 when any
    boundary broke a step's declared policy.
    """
    if ":" not in target:
        raise click.UsageError("TARGET must be MODULE:WORKFLOW")
    args, kwargs = base.parse_args_json(args_json)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    console = Console(highlight=False)
    try:
        report = crashes.crash_points(
            target,
            args,
            kwargs,
            workdir=workdir,
            effects=effects_log,
            timeout=timeout,
            only=list(only) or None,
        )
    except crashes.CrashToolError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(report)
    console.print(f"scenarios in {report.workdir}", soft_wrap=True, markup=False)
    if not report.ok:
        sys.exit(1)
