"""Commands that run durably: worker, workers, serve and the demo."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import click
from rich.text import Text

import durably
from durably import queues as queues_module
from durably import workflows as workflow_registry
from durably.cli.base import (
    SECONDS,
    _age,
    _client,
    _fail,
    _import,
    _json_lines,
    _say,
    _short_when,
    console,
    main,
)


@main.command()
@click.argument("modules", nargs=-1, required=True)
@click.option("--lease", type=SECONDS, default=30.0, show_default=True, help="Lease seconds.")
@click.option(
    "--queue",
    "queue_names",
    multiple=True,
    help="Serve this durably.Queue defined in MODULES (repeatable; default: every one).",
)
@click.option(
    "--poll",
    type=SECONDS,
    default=1.0,
    show_default=True,
    help="Seconds between looks for work when nothing announces it (SQLite; a fallback on "
    "PostgreSQL, which announces it).",
)
@click.option(
    "--max-recoveries",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Crashes before failing.",
)
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
        from durably.server import views  # late: `durably --help` does not load the server

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
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="API tokens, one NAME:TOKEN (or TOKEN) a line; else DURABLY_API_TOKEN.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Largest request body taken, in bytes (default 1048576: 1 MiB); larger is a 413.",
)
@click.pass_obj
def serve(
    database: str, host: str, port: int, token_file: str | None, max_body_bytes: int | None
) -> None:
    """Serve the JSON API and the dashboard (needs the server extra: durably[server]).

    Every request needs an API token. Off a loopback address one must be
    configured; on loopback without one, a token is made up and printed.
    """
    try:
        import uvicorn

        from durably.server import app as server_app
        from durably.server import limits
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"durably serve needs the server extra ({exc.name} is missing): "
            "pip install 'durably[server]'"
        ) from None
    try:
        tokens, made = server_app.tokens_for(host, token_file)
        limit = limits.DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
        application = server_app.create_app(database, tokens, max_body_bytes=limit)
    except durably.DurablyError as exc:
        _fail(exc)
    shown = f"[{host}]" if ":" in host else host
    # the client's url, not the one given: it shows a PostgreSQL URL without its password
    served = application.state.client.url
    console.print(f"serving {served} on http://{shown}:{port}/", soft_wrap=True)
    if made is not None:
        console.print(f"no API token configured; this run's token: {made}", soft_wrap=True)
    # An open dashboard keeps an event stream open: on Ctrl-C, give requests a
    # moment to finish, then close what is left rather than wait for the streams.
    uvicorn.run(application, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep files here.")
@click.option("--scripted", is_flag=True, help="The scripted agent: no model, no openai.")
def demo(workdir: str | None, scripted: bool) -> None:
    """The refund agent: approved, killed inside the refund, recovered without a second refund."""
    from durably import demo as demo_module

    sys.exit(demo_module.main(workdir, console, scripted=scripted))
