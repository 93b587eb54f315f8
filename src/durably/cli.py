"""The ``durably`` command line: list, show, start, worker, signal, cancel, resume, fork,
migrate, demo.

It uses only the public API: a Client to read and start, an Engine to run.
The database comes from ``--database``, else ``DURABLY_DATABASE_URL``, else
``sqlite:///durably.db``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

import durably
from durably import queues as queues_module
from durably import receipts
from durably.agents import cli as agents_cli
from durably.agents import usage as agent_usage
from durably.testing import crashes

console = Console(highlight=False)

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


def _fail(exc: Exception) -> NoReturn:
    console.print(f"[red]error:[/red] {exc}")
    sys.exit(1)


@contextlib.contextmanager
def _client(database: str) -> Iterator[durably.Client]:
    """A Client for one command; a durably error ends the command with its message."""
    try:
        with durably.Client(database) as client:
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


@click.group()
@click.option(
    "--database",
    "-d",
    envvar="DURABLY_DATABASE_URL",
    default="sqlite:///durably.db",
    show_default=True,
    help="Database URL (or DURABLY_DATABASE_URL).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log what the engine does.")
@click.pass_context
def main(ctx: click.Context, database: str, verbose: bool) -> None:
    """durably: durable execution for AI agents."""
    ctx.obj = database
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")


@main.command("list")
@click.option("--status", type=click.Choice([s.value for s in durably.Status]), default=None)
@click.option("--name", default=None, help="Only workflows of this name.")
@click.option("--limit", default=50, show_default=True)
@click.pass_obj
def list_cmd(database: str, status: str | None, name: str | None, limit: int) -> None:
    """List workflows, newest first."""
    with _client(database) as client:
        rows = client.list_workflows(status=status, name=name, limit=limit)
    table = Table("id", "workflow", "status", "created", "updated", box=None)
    for info in rows:
        style = _STATUS_STYLE.get(info.status, "")
        table.add_row(
            info.workflow_id,
            info.name,
            f"[{style}]{info.status}[/]" if style else info.status,
            _when(info.created_at),
            _when(info.updated_at),
        )
    console.print(table if rows else "no workflows", soft_wrap=True)


@main.command()
@click.argument("workflow_id")
@click.pass_obj
def show(database: str, workflow_id: str) -> None:
    """Show a workflow's receipts: each step, its attempt, duration and output."""
    with _client(database) as client:
        info = client.get_workflow(workflow_id)
        entries = client.history(workflow_id)
        claims = client.claims(workflow_id)
    print_receipts(info, entries, claims)


def print_receipts(
    info: durably.WorkflowInfo, entries: list[durably.Entry], claims: list[durably.Claim]
) -> None:
    """Print the receipts of one workflow (used by ``show`` and the demo)."""
    style = _STATUS_STYLE.get(info.status, "")
    console.print(
        f"[bold]{info.workflow_id}[/bold]  {info.name}"
        + (f" v{info.version}" if info.version else "")
        + f"  [{style}]{info.status}[/]  started {_when(info.created_at)}"
    )
    rows = receipts.receipts(entries, claims)
    names = {
        e.seq: (e.name if e.kind == "step" else f"{e.kind}() {e.name}".strip())
        + ("" if e.status == "completed" else f" ({e.status})")
        for e in rows
        if not isinstance(e, receipts.Gap)
    }
    width = min(max([24, *map(len, names.values())]), 44)
    console.print(
        f"[bold]{'seq':>4}  {'call':<{width}} {'attempt':>7} {'duration':>9}  output[/bold]"
    )
    for row in rows:
        if isinstance(row, receipts.Gap):
            console.print(f"[yellow]{row.line()}[/yellow]", soft_wrap=True)
            continue
        duration = f"{row.duration * 1000:.1f}ms" if row.duration is not None else ""
        console.print(
            f"{row.seq:>4}  {names[row.seq]:<{width}} {row.attempt:>7} {duration:>9}  "
            f"{receipts.preview(row.payload, 60)}",
            soft_wrap=True,
            markup=False,
        )
    recovered = [c.claimed_at for c in claims if c.reason == "recovery"]
    cost = agent_usage.recovery_summary(entries, recovered)
    if cost is not None:
        console.print(cost, soft_wrap=True)
    if info.output is not None:
        console.print(f"result: {receipts.preview(info.output, 200)}", soft_wrap=True)
    if info.error is not None:
        console.print(f"[red]error:[/red] {receipts.preview(info.error, 300)}")


@main.command()
@click.argument("target")
@click.argument("args_json", default="[]")
@click.option("--id", "workflow_id", default=None, help="Workflow id (idempotent).")
@click.option(
    "--wait/--no-wait", default=True, help="Run it here to the end, or leave it to a worker."
)
@click.pass_obj
def start(database: str, target: str, args_json: str, workflow_id: str | None, wait: bool) -> None:
    """Start MODULE:WORKFLOW with ARGS_JSON (a list of arguments or an object of keywords)."""
    module, _, attr = target.partition(":")
    if not attr:
        raise click.ClickException("TARGET must be MODULE:WORKFLOW")
    wf = getattr(_import(module), attr, None)
    if wf is None:
        raise click.ClickException(f"{module!r} has no attribute {attr!r}")
    args, kwargs = parse_args_json(args_json)
    try:
        if not wait:
            with durably.Client(database) as client:
                wid = client.start(wf, *args, workflow_id=workflow_id, **kwargs)
            console.print(wid)
            return
        result = durably.run(wf, *args, workflow_id=workflow_id, database=database, **kwargs)
    except durably.DurablyError as exc:
        _fail(exc)
    console.print_json(json.dumps(result, default=str))


@main.command()
@click.argument("modules", nargs=-1, required=True)
@click.option("--lease", default=30.0, show_default=True, help="Lease seconds.")
@click.option(
    "--queue",
    "queue_names",
    multiple=True,
    help="Serve this durably.Queue defined in MODULES (repeatable; default: every one).",
)
@click.option(
    "--poll",
    default=1.0,
    show_default=True,
    help="Seconds between looks for work when nothing announces it (SQLite; a fallback on "
    "PostgreSQL, which announces it).",
)
@click.option("--max-recoveries", default=5, show_default=True, help="Crashes before failing.")
@click.pass_obj
def worker(
    database: str,
    modules: tuple[str, ...],
    lease: float,
    queue_names: tuple[str, ...],
    poll: float,
    max_recoveries: int,
) -> None:
    """Import MODULES (registering their workflows and queues) and run workflows until SIGTERM.

    Run one per process, on as many machines as share the database. A worker
    runs the workflows started without a queue and those of the queues it
    serves, within their limits. On SIGTERM or Ctrl-C running steps finish
    and commit, then the workflows are released for another worker.
    """
    for module in modules:
        _import(module)
    defined = {q.name: q for q in queues_module.Queue.defined()}
    missing = [name for name in queue_names if name not in defined]
    if missing:
        raise click.ClickException(
            f"no durably.Queue named {', '.join(map(repr, missing))} in "
            f"{', '.join(modules)} (defined: {', '.join(sorted(defined)) or 'none'})"
        )
    queues = [defined[name] for name in queue_names] if queue_names else list(defined.values())

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        engine = durably.Engine(
            database,
            lease_seconds=lease,
            poll_interval=poll,
            max_recoveries=max_recoveries,
            queues=queues,
        )
        async with engine:
            serving = ", ".join(q.name for q in queues) or "none"
            console.print(
                f"worker {engine.executor_id} serving {engine.url} (queues: {serving})",
                soft_wrap=True,
            )
            await stop.wait()
            console.print("stopping: letting running steps finish")
        console.print("stopped")

    try:
        asyncio.run(serve())
    except durably.DurablyError as exc:
        _fail(exc)


@main.command()
@click.pass_obj
def workers(database: str) -> None:
    """List the executors (workers) registered in the database, oldest first."""
    with _client(database) as client:
        rows = client.executors()
    if not rows:
        console.print("no workers")
        return
    now = time.time()
    table = Table("executor", "host", "pid", "started", "last heartbeat", box=None)
    for e in rows:
        age = now - e.heartbeat_at
        beat = f"{age:.0f}s ago" if age < 3600 else _when(e.heartbeat_at)
        table.add_row(
            e.executor_id,
            e.host,
            str(e.pid),
            _when(e.started_at),
            f"[yellow]{beat}[/]" if age > 60 else beat,
        )
    console.print(table, soft_wrap=True)


@main.command("signal")
@click.argument("workflow_id")
@click.argument("name")
@click.argument("payload_json", default="null")
@click.option(
    "--key", "idempotency_key", default=None, help="Idempotency key: resending is a no-op."
)
@click.pass_obj
def signal_cmd(
    database: str, workflow_id: str, name: str, payload_json: str, idempotency_key: str | None
) -> None:
    """Send signal NAME with PAYLOAD_JSON to a workflow (no engine needs to run)."""
    try:
        payload = json.loads(payload_json)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"PAYLOAD_JSON is not JSON: {exc}") from exc
    with _client(database) as client:
        sent = client.send_signal(workflow_id, name, payload, idempotency_key=idempotency_key)
    console.print(f"signal {name!r} sent to {workflow_id}" if sent else "already sent (same key)")


@main.command()
@click.argument("workflow_id")
@click.pass_obj
def cancel(database: str, workflow_id: str) -> None:
    """Cancel a workflow and its unfinished children (at their next durable call)."""
    with _client(database) as client:
        asked = client.cancel(workflow_id)
    console.print(f"cancellation requested: {', '.join(asked) or 'nothing unfinished'}")


@main.command()
@click.argument("workflow_id")
@click.pass_obj
def resume(database: str, workflow_id: str) -> None:
    """Run a failed, cancelled or diverged workflow again from where it stopped."""
    with _client(database) as client:
        client.resume(workflow_id)
    console.print(f"{workflow_id} is pending again; a worker will resume it")


@main.command()
@click.argument("workflow_id")
@click.option("--from-seq", type=int, required=True, help="Copy journal entries up to this seq.")
@click.option("--id", "new_id", default=None, help="Id of the new workflow.")
@click.pass_obj
def fork(database: str, workflow_id: str, from_seq: int, new_id: str | None) -> None:
    """Start a copy of a workflow that replays its first entries and runs the rest live."""
    with _client(database) as client:
        fork_id = client.fork(workflow_id, from_seq, new_id)
    console.print(fork_id)


@main.group()
def review() -> None:
    """The human review queue: steps whose outcome nothing could decide."""


@review.command("list")
@click.option("--id", "workflow_id", default=None, help="Only this workflow.")
@click.pass_obj
def review_list(database: str, workflow_id: str | None) -> None:
    """List steps waiting for a decision, oldest first."""
    with _client(database) as client:
        rows = client.reviews(workflow_id)
    if not rows:
        console.print("no step awaits review")
        return
    now = time.time()
    table = Table("workflow", "seq", "step", "idempotency key", "arguments", "age", "why", box=None)
    for r in rows:
        table.add_row(
            r.workflow_id,
            str(r.seq),
            r.step,
            r.idempotency_key,
            receipts.preview(r.intent, 50),
            f"{now - r.opened_at:.0f}s",
            r.reason,
        )
    console.print(table, soft_wrap=True)


@review.command("resolve")
@click.argument("workflow_id")
@click.argument("seq", type=int)
@click.option("--result", "result_json", default=None, help="The step's result, as JSON.")
@click.option("--retry", is_flag=True, help="Run the step again with the same key.")
@click.option("--fail", "reason", default=None, help="Fail the step with this reason.")
@click.option("--by", default=lambda: os.environ.get("USER", "cli"), help="Who decides.")
@click.pass_obj
def review_resolve(
    database: str,
    workflow_id: str,
    seq: int,
    result_json: str | None,
    retry: bool,
    reason: str | None,
    by: str,
) -> None:
    """Decide once: --result JSON (it happened), --retry (it did not) or --fail REASON."""
    if sum([result_json is not None, retry, reason is not None]) != 1:
        raise click.UsageError("give exactly one of --result, --retry or --fail")
    choice: dict[str, Any] = {"retry": retry} if retry else {"fail": reason}
    if result_json is not None:
        try:
            choice = {"result": json.loads(result_json)}
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"--result is not JSON: {exc}") from exc
    with _client(database) as client:
        decided = client.resolve(workflow_id, seq, by=by, **choice)
    console.print(
        f"{workflow_id} seq {seq} ({decided.step}): {decided.decision} by {decided.decided_by}; "
        "the workflow resumes"
    )


@main.command()
@click.pass_obj
def migrate(database: str) -> None:
    """Bring the database schema up to date."""
    with _client(database) as client:
        version = client.schema_version()
    console.print(f"{database}: schema version {version}")


main.add_command(crashes.test_crashes_command)
main.add_command(agents_cli.approvals_cmd)
main.add_command(agents_cli.approve_cmd)
main.add_command(agents_cli.reject_cmd)
main.add_command(agents_cli.budget_cmd)


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep files here.")
@click.option("--scripted", is_flag=True, help="The scripted agent: no model, no openai.")
def demo(workdir: str | None, scripted: bool) -> None:
    """The refund agent: approved, killed inside the refund, recovered without a second refund."""
    from durably import demo as demo_module

    sys.exit(demo_module.main(workdir, console, scripted=scripted))


if __name__ == "__main__":
    main()
