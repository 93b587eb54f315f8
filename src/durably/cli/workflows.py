"""Commands on workflows: list, show, start, signal, cancel, resume, fork, migrate."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

import durably
from durably import receipts, serving
from durably import workflows as workflow_registry
from durably.agents import approvals, budget
from durably.cli import selection
from durably.cli.base import (
    _client,
    _fail,
    _import,
    _json_lines,
    _say,
    _short_when,
    _status,
    _when,
    console,
    main,
    parse_args_json,
)


@main.command("list")
@selection.filter_options
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Skip this many rows first.",
)
@click.option("--after", default=None, help="Start after this workflow id (the last one seen).")
@click.option("--order", type=click.Choice(["desc", "asc"]), default="desc", show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--stranded",
    is_flag=True,
    help="Only unfinished workflows that no running worker can resume (their workflow "
    "or version is registered by none), with what to do.",
)
@click.pass_obj
def list_cmd(
    database: str,
    /,
    offset: int,
    after: str | None,
    order: str,
    limit: int,
    as_json: bool,
    stranded: bool,
    **options: Any,
) -> None:
    """List workflows, newest first (--order asc: oldest first), filtered.

    The note column says why an unfinished workflow may not move: no running
    worker serves its workflow or its queue, or the workers run other code
    than the code that started it. With --stranded, only the unfinished
    workflows that no running worker can resume (none registers their workflow
    at their version), each with what to do.
    """
    chosen = selection.filters(**options)
    now = time.time()
    found: dict[str, list[serving.Note]]
    with _client(database, create=False) as client:
        executors = client.executors()
        if stranded:
            picked = _stranded(client, chosen, executors, now, order, after)[
                offset : offset + limit
            ]
            rows = [info for info, _ in picked]
            found = {info.workflow_id: [note] for info, note in picked}
        else:
            rows = client.list_workflows(
                limit=limit, offset=offset, order=order, after=after, **chosen
            )
    if not stranded:
        found = {info.workflow_id: serving.notes(info, executors, now) for info in rows}
    if stranded and not rows and not as_json:
        console.print("no stranded workflows")
        return
    if as_json:
        from durably.server import views  # late: `durably --help` does not load the server

        _json_lines(
            {**views.workflow(info), "notes": [n.text for n in found[info.workflow_id]]}
            for info in rows
        )
        return
    if not rows:
        console.print("no workflows")
        return
    cells: list[tuple[Text, ...]] = []
    for info in rows:
        shown = _status(info.status)
        if found[info.workflow_id]:
            shown.append(" !", "yellow")  # explained below the table
        cells.append(
            (
                Text(info.workflow_id),
                Text(info.name + (f" v{info.version}" if info.version else "")),
                shown,
                Text(info.queue or ""),
                Text(_short_when(info.created_at, now)),
            )
        )
    table = Table(box=None, pad_edge=False)
    for header, width in zip(_HEADERS, _widths(cells, console.width), strict=True):
        # status and time whole; the rest fold (never cut) where the terminal is narrow
        table.add_column(header, width=width, overflow="fold", no_wrap=header in _WHOLE)
    for row in cells:
        table.add_row(*row)
    console.print(table)
    for info in rows:  # what the marks mean, in full
        for note in found[info.workflow_id]:
            console.print(
                Text.assemble(("! ", "yellow"), (info.workflow_id, "bold"), ": ", note.text)
            )


_HEADERS = ("id", "workflow", "status", "queue", "created")
_WHOLE = {"status", "created"}


def _widths(cells: list[tuple[Text, ...]], terminal: int) -> list[int | None]:
    """The widths of the list's columns: each as wide as its widest cell when they all
    fit; else the status and the time whole, the queue up to 16, an id up to 36 (a uuid)
    and the workflow's name what is left (at least 8), the id taking what the name leaves.

    Left to rich, a long id or name took the room of the columns after it: the time of
    creation was cut (to a time that looks right) or dropped.
    """
    wanted = [
        max(len(header), *(len(row[i].plain) for row in cells)) for i, header in enumerate(_HEADERS)
    ]
    gaps = 2 * (len(_HEADERS) - 1)
    if sum(wanted) + gaps <= terminal:
        return [None] * len(_HEADERS)
    ident, name, status, queue, created = wanted
    queue = min(queue, 16)
    room = terminal - gaps - status - queue - created  # for the id and the name
    ident = max(min(ident, max(min(36, ident), room - name), room - min(name, 8)), 1)
    return [ident, max(room - ident, 1), status, queue, created]


_PAGE = 500


def _stranded(
    client: durably.Client,
    chosen: dict[str, Any],
    executors: list[durably.ExecutorInfo],
    now: float,
    order: str,
    after: str | None,
) -> list[tuple[durably.WorkflowInfo, serving.Note]]:
    """The stranded workflows among those ``chosen`` selects, in ``order``, with why.

    Read page by page over the unfinished statuses (a finished workflow is never
    stranded), so a database of many finished ones is not read whole.
    """
    asked = chosen.pop("status")
    statuses = [s.value for s in durably.Status if not s.finished]
    if asked is not None:
        statuses = [asked] if asked in statuses else []
    rows: list[durably.WorkflowInfo] = []
    for status in statuses:
        cursor: str | None = None
        while True:
            page = client.list_workflows(status, limit=_PAGE, order=order, after=cursor, **chosen)
            rows.extend(page)
            if len(page) < _PAGE:
                break
            cursor = page[-1].workflow_id
    rows.sort(key=lambda r: (r.created_at, r.workflow_id), reverse=order == "desc")
    if after is not None:
        ids = [r.workflow_id for r in rows]
        rows = rows[ids.index(after) + 1 :] if after in ids else rows
    notes = [(info, serving.stranded(info, executors, now)) for info in rows]
    return [(info, note) for info, note in notes if note is not None]


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
        reviews = [] if as_json else client.reviews(workflow_id)
        unread = {s["name"] for s in client.signals(workflow_id) if s["consumed_seq"] is None}
    notes = [note.text for note in serving.notes(info, executors, time.time())]
    if as_json:
        from durably.server import views  # late: `durably --help` does not load the server

        # the keys it shares with GET /api/workflows/{id}/history, built by the same function
        document = {
            "workflow": views.workflow(info),
            "notes": notes,
            **views.journal_document(entries, claims),
        }
        click.echo(json.dumps(document, sort_keys=True, default=str))
        return
    print_receipts(info, entries, claims, notes, _waits(info, entries, reviews, unread))


def _waits(
    info: durably.WorkflowInfo,
    entries: list[durably.Entry],
    reviews: list[durably.Review],
    unread: set[str],
) -> list[str]:
    """What an unfinished workflow waits for, each with the command that moves it on (a
    signal sent and not read yet is not waited for: a worker reads it)."""
    if info.finished:
        return []
    wid = shlex.quote(info.workflow_id)
    found = [
        f"a decision on {r.step} (seq {r.seq}): durably review list --id {wid}" for r in reviews
    ]
    for entry in entries:
        if entry.kind != "signal" or entry.status != "started" or entry.name in unread:
            continue
        if entry.name.startswith(approvals.PREFIX):
            found.append(f"an approval: durably approvals {wid}")
        elif entry.name == budget.SIGNAL:
            found.append(
                f"its model budget: durably budget {wid} --by NAME --max-cost DOLLARS (or --stop)"
            )
        else:
            name = shlex.quote(entry.name)
            found.append(f"signal {entry.name!r}: durably signal {wid} {name} PAYLOAD_JSON")
    return list(dict.fromkeys(found))


def _wakes(wake_at: float) -> str:
    """When a parked workflow wakes, or since when it is due (a worker takes it)."""
    return f"  {'wakes' if wake_at > time.time() else 'due since'} {_when(wake_at)}"


#: The width of a receipt row besides its call and its output: seq, attempt, duration, gaps.
_RECEIPT = len(f"{0:>4}  {'':<0} {0:>7} {'':>9}  ")


def _cut(label: str, most: int) -> str:
    """A receipt's call in ``most`` characters: its name cut, its status (``(started)``)
    kept whole."""
    if len(label) <= most:
        return label
    name, gap, status = label.rpartition(" (")
    if not gap or not status.endswith(")"):
        name, status = label, ""
    else:
        status = gap + status
    return name[: max(most - len(status) - 1, 1)] + "…" + status


def print_receipts(
    info: durably.WorkflowInfo,
    entries: list[durably.Entry],
    claims: list[durably.Claim],
    notes: list[str] | None = None,
    waits: list[str] | None = None,
) -> None:
    """Print the receipts of one workflow (used by ``show`` and the demo), after what
    stands in its way (``notes``) and what it waits for (``waits``).

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
            *([f"  deadline {_when(info.deadline_at)}"] if info.deadline_at is not None else []),
            *([_wakes(info.wake_at)] if info.wake_at and not info.finished else []),
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
    for wait in waits or []:
        console.print(Text(f"waits for {wait}", style="cyan"), soft_wrap=True)
    for warning in (info.warnings or "").splitlines():  # what replays went on past
        console.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
    rows = receipts.receipts(entries, claims)
    names = {e.seq: receipts.label(e) for e in rows if not isinstance(e, receipts.Gap)}
    # The columns besides the call and the output take _RECEIPT; the output has the rest
    # of the terminal (up to 60, at least 24 beside a call that fits its column, and 10
    # beside a longer one, which is cut to leave those).
    room = console.width - _RECEIPT
    width = min(max([24, *map(len, names.values())]), 44, max(24, room - 24))
    console.print(
        f"[bold]{'seq':>4}  {'call':<{width}} {'attempt':>7} {'duration':>9}  output[/bold]"
    )
    for row in rows:
        if isinstance(row, receipts.Gap):
            console.print(Text(row.line(), style="yellow"), soft_wrap=True)
            continue
        name = _cut(names[row.seq], max(width, room - 10))
        duration = f"{row.duration * 1000:.1f}ms" if row.duration is not None else ""
        shown = min(60, max(10, room - max(width, len(name))))
        _say(
            f"{row.seq:>4}  {name:<{width}} {row.attempt:>7} {duration:>9}  "
            f"{receipts.preview(row.payload, shown)}"
        )
    from durably.server import views  # late: `durably --help` does not load the server

    cost = views.usage_line(entries, claims)  # as the dashboard says it
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
        info = client.get_workflow(workflow_id)
    name = info.name
    here = workflow_registry.registered(name)
    if here is None:
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
    if here.version != info.version:  # an engine here would never claim it: it would hang
        loaded = f"version {here.version!r}" if here.version else "no version"
        raise click.ClickException(
            f"workflow {workflow_id!r} was started by workflow "
            f"{serving.describe(name, info.version)}; {', '.join(modules) or 'the code here'} "
            f"registers it at {loaded}, and only the same version resumes it: give the module "
            f"of that version, or --no-wait to leave it to a worker that has it"
        )


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
--from-seq) and runs the rest live, on the code loaded now. Refused when those
entries hold a step whose outcome is open (its intent without a receipt, or a
retry to come): fork from before it, or once it has settled.

Prints the new id. {_IN_PLACE}"""
)
@click.argument("workflow_id")
@click.argument("modules", nargs=-1)
@click.option(
    "--from-seq",
    type=click.IntRange(min=0),
    required=True,
    help="Copy journal entries up to this seq.",
)
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


@main.command()
@click.pass_obj
def migrate(database: str) -> None:
    """Bring the database schema up to date."""
    with _client(database) as client:
        version = client.schema_version()
    _say(f"{database}: schema version {version}")
