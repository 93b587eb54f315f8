"""The ``durably`` command line: list, show, start, worker, serve, signal, cancel, resume,
fork, migrate, demo.

It uses only the public API: a Client to read and start, an Engine to run.
The database comes from ``--database``, else ``DURABLY_DATABASE_URL``, else
``sqlite:///durably.db``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

import durably
from durably import admin, receipts, selection, serving
from durably import queues as queues_module
from durably import workflows as workflow_registry
from durably.agents import cli as agents_cli
from durably.agents import usage as agent_usage
from durably.server import views
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
    console.print(Text.assemble(("error:", "red"), " ", str(exc)), soft_wrap=True)
    sys.exit(1)


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
@click.version_option(durably.__version__, prog_name="durably", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, database: str, verbose: bool) -> None:
    """durably: durable execution for AI agents."""
    ctx.obj = database
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")


@main.command("list")
@selection.filter_options
@click.option("--offset", default=0, show_default=True, help="Skip this many rows first.")
@click.option("--after", default=None, help="Start after this workflow id (the last one seen).")
@click.option("--order", type=click.Choice(["desc", "asc"]), default="desc", show_default=True)
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def list_cmd(
    database: str,
    /,
    offset: int,
    after: str | None,
    order: str,
    limit: int,
    as_json: bool,
    **options: Any,
) -> None:
    """List workflows, newest first (--order asc: oldest first), filtered.

    The note column says why an unfinished workflow may not move: no running
    worker serves its workflow or its queue, or the workers run other code
    than the code that started it.
    """
    chosen = selection.filters(**options)
    with _client(database, create=False) as client:
        rows = client.list_workflows(limit=limit, offset=offset, order=order, after=after, **chosen)
        executors = client.executors()
    now = time.time()
    found = {info.workflow_id: serving.notes(info, executors, now) for info in rows}
    if as_json:
        _json_lines(
            {**views.workflow(info), "notes": [n.text for n in found[info.workflow_id]]}
            for info in rows
        )
        return
    if not rows:
        console.print("no workflows")
        return
    table = Table(box=None, pad_edge=False)
    # Ids stay whole up to 36 characters (a uuid); beyond that they fold, never cut.
    longest = max(len(info.workflow_id) for info in rows)
    table.add_column("id", overflow="fold", min_width=min(36, longest))
    table.add_column("workflow", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("queue", overflow="fold")
    table.add_column("created", no_wrap=True)
    for info in rows:
        shown = _status(info.status)
        if found[info.workflow_id]:
            shown.append(" !", "yellow")  # explained below the table
        table.add_row(
            Text(info.workflow_id),
            Text(info.name + (f" v{info.version}" if info.version else "")),
            shown,
            Text(info.queue or ""),
            _short_when(info.created_at, now),
        )
    console.print(table)
    for wid, notes in found.items():  # what the marks mean, in full
        for note in notes:
            console.print(Text.assemble(("! ", "yellow"), (wid, "bold"), ": ", note.text))


@main.command()
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_obj
def show(database: str, workflow_id: str, as_json: bool) -> None:
    """Show a workflow's receipts: each step, its attempt, duration and output."""
    with _client(database, create=False) as client:
        info = client.get_workflow(workflow_id)
        entries = client.history(workflow_id)
        claims = client.claims(workflow_id)
        executors = client.executors()
    notes = [note.text for note in serving.notes(info, executors, time.time())]
    if as_json:
        document = {
            "workflow": views.workflow(info),
            "notes": notes,
            "timeline": views.timeline(entries, claims),
            "usage": views.usage_line(entries, claims),
            "entries": [views.entry(e) for e in entries],
            "claims": [dataclasses.asdict(c) for c in claims],
        }
        click.echo(json.dumps(document, sort_keys=True, default=str))
        return
    print_receipts(info, entries, claims, notes)


def _json_lines(records: Iterable[dict[str, Any]]) -> None:
    """Print one JSON object per line, keys sorted: the stable form scripts read."""
    for record in records:
        click.echo(json.dumps(record, sort_keys=True, default=str))


def print_receipts(
    info: durably.WorkflowInfo,
    entries: list[durably.Entry],
    claims: list[durably.Claim],
    notes: list[str] | None = None,
) -> None:
    """Print the receipts of one workflow (used by ``show`` and the demo).

    Every piece of user text (ids, names, payloads, errors) is printed as
    text, never read as rich markup.
    """
    console.print(
        Text.assemble(
            (info.workflow_id, "bold"),
            "  ",
            info.name + (f" v{info.version}" if info.version else ""),
            "  ",
            _status(info.status),
            f"  started {_when(info.created_at)}",
            *([f"  queue {info.queue}"] if info.queue else []),
            *(
                [f"  forked from {info.forked_from} at seq {info.forked_from_seq}"]
                if info.forked_from
                else []
            ),
        ),
        soft_wrap=True,
    )
    for note in notes or []:
        console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
    rows = receipts.receipts(entries, claims)
    names = {e.seq: receipts.label(e) for e in rows if not isinstance(e, receipts.Gap)}
    width = min(max([24, *map(len, names.values())]), 44)
    console.print(
        f"[bold]{'seq':>4}  {'call':<{width}} {'attempt':>7} {'duration':>9}  output[/bold]"
    )
    for row in rows:
        if isinstance(row, receipts.Gap):
            console.print(Text(row.line(), style="yellow"), soft_wrap=True)
            continue
        duration = f"{row.duration * 1000:.1f}ms" if row.duration is not None else ""
        _say(
            f"{row.seq:>4}  {names[row.seq]:<{width}} {row.attempt:>7} {duration:>9}  "
            f"{receipts.preview(row.payload, 60)}"
        )
    recovered = [c.claimed_at for c in claims if c.reason == "recovery"]
    cost = agent_usage.recovery_summary(entries, recovered)
    if cost is not None:
        _say(cost)
    if info.output is not None:
        _say(f"result: {receipts.preview(info.output, 200)}")
    if info.error is not None:
        console.print(
            Text.assemble(("error:", "red"), " ", receipts.preview(info.error, 300)),
            soft_wrap=True,
        )


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
    if not wait:
        with _client(database) as client:
            wid = client.start(wf, *args, workflow_id=workflow_id, **kwargs)
        _say(wid)
        return

    async def begin(engine: durably.Engine) -> durably.WorkflowHandle:
        return await engine.start(wf, *args, workflow_id=workflow_id, **kwargs)

    _run_here(database, begin)


def _run_here(
    database: str, begin: Callable[[durably.Engine], Awaitable[durably.WorkflowHandle]]
) -> None:
    """Open an engine here, let ``begin`` start or reopen a workflow, run it to its end
    and print its result (or its error, without a traceback: exit 1)."""

    async def main() -> Any:
        async with durably.Engine(database) as engine:
            handle = await begin(engine)
            return await handle.result()

    try:
        result = asyncio.run(main())
    except Exception as exc:  # a durably error, or the workflow's own error re-raised
        if not isinstance(exc, durably.DurablyError):
            exc = durably.DurablyError(f"the workflow failed: {type(exc).__name__}: {exc}")
        _fail(exc)
    console.print_json(json.dumps(result, default=str))


def _runnable_here(database: str, workflow_id: str, modules: tuple[str, ...]) -> None:
    """Import ``modules`` and check they register the workflow's code, before anything
    changes: running it here needs its code, as a worker does."""
    for module in modules:
        _import(module)
    with _client(database, create=False) as client:
        name = client.get_workflow(workflow_id).name
    if workflow_registry.registered(name) is None:
        where = (
            f"which MODULES ({', '.join(modules)}) did not register"
            if modules
            else "whose code is not loaded here"
        )
        raise click.ClickException(
            f"workflow {workflow_id!r} runs the workflow {name!r}, {where}: give the module "
            f"that defines it (durably resume {workflow_id} MODULE), or --no-wait to leave "
            "it to a running worker"
        )


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
@click.option(
    "--strict-code",
    is_flag=True,
    help="Never take a workflow started by other code (another source hash) than this "
    "worker's; leave it for a worker with the same code.",
)
@click.pass_obj
def worker(
    database: str,
    modules: tuple[str, ...],
    lease: float,
    queue_names: tuple[str, ...],
    poll: float,
    max_recoveries: int,
    strict_code: bool,
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
            strict_code=strict_code,
        )
        async with engine:
            served = ", ".join(q.name for q in queues) or "none"
            _say(f"worker {engine.executor_id} serving {engine.url} (queues: {served})")
            _say(f"workflows: {', '.join(workflow_registry.registered_names()) or 'none'}")
            await stop.wait()
            console.print("stopping: letting running steps finish")
        console.print("stopped")

    try:
        asyncio.run(serve())
    except durably.DurablyError as exc:
        _fail(exc)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def workers(database: str, as_json: bool) -> None:
    """List the executors (workers) registered in the database, oldest first, with the
    workflows and queues each serves."""
    with _client(database, create=False) as client:
        rows = client.executors()
    if as_json:
        _json_lines(views.executor(e, time.time()) for e in rows)
        return
    if not rows:
        console.print("no workers")
        return
    now = time.time()
    # A block per executor: its id whole on the first line, what it serves wrapped below.
    for e in rows:
        age = now - e.heartbeat_at
        beat = _age(age)
        served = [name + (f" v{v}" if v else "") for name, v, _ in e.workflows]
        console.print(Text(e.executor_id, "bold"), soft_wrap=True)
        console.print(
            Text.assemble(
                f"  host {e.host}, pid {e.pid}, started {_short_when(e.started_at, now)}, "
                "last heartbeat ",
                (beat, "yellow" if age > 60 else ""),
            )
        )
        console.print(Text(f"  workflows: {', '.join(served) or '(none registered)'}"))
        console.print(Text(f"  queues: {', '.join(e.queues) or '(none)'}"))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="API tokens, one NAME:TOKEN (or TOKEN) a line; else DURABLY_API_TOKEN.",
)
@click.pass_obj
def serve(database: str, host: str, port: int, token_file: str | None) -> None:
    """Serve the JSON API and the dashboard (needs the server extra: durably[server]).

    Every request needs an API token. Off a loopback address one must be
    configured; on loopback without one, a token is made up and printed.
    """
    try:
        import uvicorn

        from durably.server import app as server_app
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"durably serve needs the server extra ({exc.name} is missing): "
            "pip install 'durably[server]'"
        ) from None
    try:
        tokens, made = server_app.tokens_for(host, token_file)
        application = server_app.create_app(database, tokens)
    except durably.DurablyError as exc:
        _fail(exc)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"serving {database} on http://{shown}:{port}/", soft_wrap=True)
    if made is not None:
        console.print(f"no API token configured; this run's token: {made}", soft_wrap=True)
    uvicorn.run(application, host=host, port=port, log_level="warning")


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
    with _client(database, create=False) as client:
        sent = client.send_signal(workflow_id, name, payload, idempotency_key=idempotency_key)
    _say(f"signal {name!r} sent to {workflow_id}" if sent else "already sent (same key)")


@main.command()
@click.argument("workflow_id", required=False)
@selection.filter_options
@click.pass_obj
def cancel(database: str, /, workflow_id: str | None, **options: Any) -> None:
    """Cancel a workflow and its unfinished children (at their next durable call), or
    every workflow the filters select (in one transaction; prints the ids asked)."""
    chosen = selection.filters(**options)
    if workflow_id is None and not selection.selected(chosen):
        raise click.UsageError("give a workflow ID or a filter (--status, --name, ...)")
    with _client(database, create=False) as client:
        if not selection.selected(chosen):
            asked = client.cancel(str(workflow_id))
            _say(f"cancellation requested: {', '.join(asked) or 'nothing unfinished'}")
            return
        if workflow_id is not None:
            chosen["ids"] = [workflow_id, *(chosen["ids"] or [])]
        for wid in client.cancel_workflows(**chosen):
            _say(wid)


_IN_PLACE = (
    "By default it runs here, as `start` does, until it ends: give the MODULES that "
    "define its workflow (imported as `durably worker` imports them). With --no-wait it "
    "is only marked pending, for a running `durably worker` to take."
)


@main.command(
    help=f"""Run a failed, cancelled or diverged workflow again from where it
stopped, or a pending one waiting on its queue now (it leaves the queue).

{_IN_PLACE}

With filters (--status, --name, ...) and no ID, every workflow they select is
made pending for the workers, all or none, and its id printed."""
)
@click.argument("workflow_id", required=False)
@click.argument("modules", nargs=-1)
@click.option(
    "--wait/--no-wait", default=True, help="Run it here to the end, or leave it to a worker."
)
@selection.filter_options
@click.pass_obj
def resume(
    database: str, /, workflow_id: str | None, modules: tuple[str, ...], wait: bool, **options: Any
) -> None:
    chosen = selection.filters(**options)
    if selection.selected(chosen):
        if workflow_id is not None:
            raise click.UsageError("give a workflow ID or filters, not both")
        with _client(database, create=False) as client:
            for wid in client.resume_workflows(**chosen):
                _say(wid)
        return
    if workflow_id is None:
        raise click.UsageError("give a workflow ID or a filter (--status, --name, ...)")
    if not wait:
        with _client(database, create=False) as client:
            client.resume(workflow_id)
        _say(f"{workflow_id} is pending again; a running worker will resume it")
        return
    _runnable_here(database, workflow_id, modules)

    async def begin(engine: durably.Engine) -> durably.WorkflowHandle:
        return await engine.resume(workflow_id)

    _run_here(database, begin)


@main.command(
    help=f"""Start a copy of a workflow that replays its first entries (up to
--from-seq) and runs the rest live, on the code loaded now.

Prints the new id. {_IN_PLACE}"""
)
@click.argument("workflow_id")
@click.argument("modules", nargs=-1)
@click.option("--from-seq", type=int, required=True, help="Copy journal entries up to this seq.")
@click.option("--id", "new_id", default=None, help="Id of the new workflow.")
@click.option(
    "--wait/--no-wait", default=True, help="Run it here to the end, or leave it to a worker."
)
@click.pass_obj
def fork(
    database: str,
    workflow_id: str,
    modules: tuple[str, ...],
    from_seq: int,
    new_id: str | None,
    wait: bool,
) -> None:
    if not wait:
        with _client(database, create=False) as client:
            fork_id = client.fork(workflow_id, from_seq, new_id)
        _say(fork_id)
        return
    _runnable_here(database, workflow_id, modules)

    async def begin(engine: durably.Engine) -> durably.WorkflowHandle:
        handle = await engine.fork(workflow_id, from_seq, new_id)
        _say(handle.workflow_id)
        return handle

    _run_here(database, begin)


@main.group()
def review() -> None:
    """The human review queue: steps whose outcome nothing could decide."""


@review.command("list")
@click.option("--id", "workflow_id", default=None, help="Only this workflow.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def review_list(database: str, workflow_id: str | None, as_json: bool) -> None:
    """List steps waiting for a decision, oldest first."""
    with _client(database, create=False) as client:
        rows = client.reviews(workflow_id)
    if as_json:
        _json_lines(views.review(r) for r in rows)
        return
    if not rows:
        console.print("no step awaits review")
        return
    now = time.time()
    # A block per step, not a table: the workflow id and key that `resolve` needs are
    # printed whole at any width, with the command to run.
    for r in rows:
        console.print(
            Text.assemble(
                (r.workflow_id, "bold"), f"  seq {r.seq}  ", r.step, f"  {_age(now - r.opened_at)}"
            ),
            soft_wrap=True,
        )
        _say(f"  key        {r.idempotency_key}")
        _say(f"  arguments  {receipts.preview(r.intent, 200)}")
        _say(f"  why        {r.reason}")
        _say(f"  decide     durably review resolve {r.workflow_id} {r.seq} \\")
        _say("                 --result JSON | --retry | --fail REASON")


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
    with _client(database, create=False) as client:
        decided = client.resolve(workflow_id, seq, by=by, **choice)
    _say(
        f"{workflow_id} seq {seq} ({decided.step}): {decided.decision} by {decided.decided_by}; "
        "the workflow resumes"
    )


@main.command()
@click.pass_obj
def migrate(database: str) -> None:
    """Bring the database schema up to date."""
    with _client(database) as client:
        version = client.schema_version()
    _say(f"{database}: schema version {version}")


main.add_command(crashes.test_crashes_command)
main.add_command(agents_cli.approvals_cmd)
main.add_command(agents_cli.approve_cmd)
main.add_command(agents_cli.reject_cmd)
for _command in admin.COMMANDS:  # export, import, prune, backup (docs/operations.md)
    main.add_command(_command)
main.add_command(selection.delete_cmd)
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
