"""``durably demo``: a refund agent driven by a model, parked for approval, killed, recovered.

The agent (a :class:`durably.Agent` with the real ``openai`` client) handles
ticket TCK-4417: the model looks up the ticket and the order, refunds $120.00
on ORD-9912 through a fake payments service (a real HTTP server on 127.0.0.1
that logs every request and honours Idempotency-Key), emails the customer and
answers. The model is :class:`durably.testing.models.FakeModelServer`, scripted
by turn (no API key), or a real OpenAI-compatible endpoint when
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` are set (``OPENAI_MODEL``, default
``gpt-4.1-mini``).

1. A first process runs the agent until the refund, over $100, needs approval:
   the workflow parks (``waiting``) and the process exits.
2. Another process (``durably approve ... --by demo``) approves it.
3. A third process resumes the agent and is killed with SIGKILL inside
   issue_refund, after the payment call returned and before the tool's receipt
   was committed.
4. A fourth process recovers the workflow and finishes it.

The payments log then shows two requests with one key and one refund, the model
server's log shows every model turn asked once, and the receipts show where the
process was dead. ``durably demo --scripted`` is the earlier demo: the same
refund, planned by a script instead of a model, with no ``openai`` needed.

Files: the database ``demo.db`` is kept (in a new ``durably-demo-*`` folder
under the temporary directory) and the demo ends with the ``durably show``
command that reads it; ``payments.log``, ``model.log`` (the fake model server's
requests) and ``outbox.log`` (the emails), all JSON lines, are removed at the
end unless ``--workdir DIR`` keeps everything in DIR.

Every line it prints fits 80 columns (a path longer than the terminal aside),
and a command it prints is complete and runs as printed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

import durably
from durably import receipts
from durably.agents import PendingApproval
from durably.demo_agents import (
    APPROVER,
    DEFAULT_MODEL,
    MODEL_ENV,
    MODEL_URL_ENV,
    OUTBOX_ENV,
    PAYMENTS_ENV,
    WIDTH,
    WORKFLOW_ID,
    agent,
    model_script,
    refund_agent,
    say,
    support_agent,
)
from durably.testing import payments

# --- the child processes ----------------------------------------------------------------------


async def _child(role: str, database: str) -> int:
    """Run the workflow in this process: ``scripted``, ``park`` (until waiting) or ``run``."""
    if role == "scripted":
        async with durably.Engine(database) as engine:
            handle = await engine.start(refund_agent, "TCK-4417", workflow_id=WORKFLOW_ID)
            result = await handle.result()
        say(f"workflow completed: refund_id={result['refund_id']} email={result['email']}")
        return 0
    model = agent()
    try:
        async with durably.Engine(database, hold_seconds=0.05, poll_interval=0.1) as engine:
            handle = await engine.start(support_agent, "TCK-4417", workflow_id=WORKFLOW_ID)
            if role == "park":
                deadline = time.monotonic() + 60
                while (status := await handle.status()) != "waiting":
                    if durably.Status(status).finished or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                why = " for a person's approval" if status == "waiting" else ""
                print(f"    workflow {WORKFLOW_ID} is {status}{why}", flush=True)
                return 0
            result = await handle.result(timeout=120)
        say(f"workflow completed: {result['output']}")
        return 0
    finally:
        await model.client.close()


def _spawn(role: str, database: str, env: dict[str, str]) -> int:
    argv = [sys.executable, "-m", "durably.demo", "--child", role, "--database", database]
    return subprocess.run(argv, env=env, check=False).returncode


def _exit_text(code: int) -> str:
    return "SIGKILL" if code == -9 else "no kill" if code == 0 else "failed"


def _openai_missing() -> bool:
    try:
        import openai  # noqa: F401
    except ImportError:
        return True
    return False


# --- the demo ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Places:
    """Where the demo's files go: the database it keeps, and its work files."""

    database: Path
    work: Path

    @property
    def url(self) -> str:
        return f"sqlite:///{self.database}"


@contextlib.contextmanager
def places(workdir: str | None) -> Iterator[Places]:
    """``--workdir DIR`` keeps every file in DIR; otherwise only the database is kept.

    The database goes to a new ``durably-demo-*`` folder under the temporary
    directory, which the demo names at the start and the end; the logs go to a
    work folder that is removed on the way out, whatever happened.
    """
    if workdir is not None:
        folder = Path(workdir)
        folder.mkdir(parents=True, exist_ok=True)
        yield Places(folder / "demo.db", folder)
        return
    kept = Path(tempfile.mkdtemp(prefix="durably-demo-"))
    with tempfile.TemporaryDirectory(prefix="durably-demo-work-") as work:
        yield Places(kept / "demo.db", Path(work))


def main(
    workdir: str | None = None, console: Console | None = None, *, scripted: bool = False
) -> int:
    """Run the demo; 0 when there is exactly one refund (and, with a model, no turn paid twice)."""
    out = console or Console(highlight=False)
    if not scripted and _openai_missing():
        _para(
            out,
            "openai is not installed (pip install -e '.[agents]'); running the scripted "
            "demo instead (durably demo --scripted)",
            indent="",
            style="yellow",
        )
        out.print()
        scripted = True
    with places(workdir) as where:
        code = scripted_demo(where, out) if scripted else agent_demo(where, out)
    _next_step(out, where)
    return code


def _para(out: Console, text: str, indent: str = "   ", style: str | None = None) -> None:
    """Print plain text wrapped to the demo's width, every line indented."""
    width = min(out.width, WIDTH)
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,  # a long id or URL stays whole, on a line of its own
        break_on_hyphens=False,
    )
    out.print("\n".join(lines), markup=False, soft_wrap=True, style=style)


def _command(out: Console, *parts: list[str]) -> None:
    """Print a shell command whole, one part per line (joined by backslashes), as it runs."""
    lines = [shlex.join(part) for part in parts]
    out.print("   $ " + " \\\n     ".join(lines), markup=False, soft_wrap=True)


def _next_step(out: Console, where: Places) -> None:
    """Where the database is, and the command that shows every receipt in it."""
    out.print(f"\nThe database is kept: {where.database}", markup=False, soft_wrap=True)
    out.print("Every receipt, with its output:")
    _command(out, ["durably"], ["--database", where.url], ["show", WORKFLOW_ID])


def _base_env(payments_url: str, outbox: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLY_CRASH")}
    env.pop(MODEL_URL_ENV, None)
    env[PAYMENTS_ENV] = payments_url
    env[OUTBOX_ENV] = str(outbox)
    return env


def _print_payments(out: Console, log: Path, title: str) -> bool:
    """The payments log; True when it holds exactly one refund, under one key."""
    requests = [r for r in payments.read_log(log) if r.get("method") == "POST"]
    refunds = payments.refunds_in_log(log)
    keys = {r.get("idempotency_key") for r in requests}
    out.print(f"[bold]{title}[/bold] (each request's Idempotency-Key)")
    for r in requests:
        out.print(
            f"   POST {r['path']}  key {r['idempotency_key']}  {r['refund_id']}  "
            f"{'new refund' if r['created'] else 'replayed'}",
            markup=False,
            soft_wrap=True,
        )
    out.print(
        f"   => {len(requests)} requests, {len(keys)} key, [bold]{len(refunds)} refund[/bold]\n"
    )
    return len(refunds) == 1 and len(keys) == 1


def _print_receipts(out: Console, database: str, title: str) -> durably.WorkflowInfo:
    """The journal, one line per durable call, with the gap where the process was dead.

    Narrower than ``durably show`` (no outputs), so that nothing is cut at 80
    columns; the demo ends with the ``durably show`` command for the rest.
    """
    with durably.Client(database) as client:
        info = client.get_workflow(WORKFLOW_ID)
        rows = receipts.receipts(client.history(WORKFLOW_ID), client.claims(WORKFLOW_ID))
    out.print(f"[bold]{title}[/bold] of {WORKFLOW_ID}: {info.status}")
    names = {
        e.seq: (e.name if e.kind == "step" else f"{e.kind}() {e.name}".strip())
        + ("" if e.status == "completed" else f" ({e.status})")
        for e in rows
        if not isinstance(e, receipts.Gap)
    }
    width = max([30, *map(len, names.values())])
    out.print(f"[bold]{'seq':>4}  {'call':<{width}} {'attempt':>7} {'duration':>9}[/bold]")
    for row in rows:
        if isinstance(row, receipts.Gap):
            out.print(row.line(), style="yellow", markup=False, soft_wrap=True)
            continue
        duration = f"{row.duration * 1000:.1f}ms" if row.duration is not None else ""
        out.print(
            f"{row.seq:>4}  {names[row.seq]:<{width}} {row.attempt:>7} {duration:>9}",
            markup=False,
            soft_wrap=True,
        )
    return info


def _approve(out: Console, database: str, env: dict[str, str]) -> PendingApproval | None:
    """Show the pending approval, then approve it with ``durably approve`` in another process."""
    with durably.Client(database) as client:
        pending = client.list_approvals(WORKFLOW_ID)
    if len(pending) != 1 or pending[0].tool != "issue_refund":
        found = ", ".join(p.describe() for p in pending) or "none"
        _para(out, f"expected one pending issue_refund; found {found}", style="red")
        return None
    [p] = pending
    _para(out, f"pending: {p.describe()}, call {p.tool_call_id}")
    parts = [
        ["--database", database],
        ["approve", WORKFLOW_ID, "--by", APPROVER],
        ["--expect", p.args_sha256],  # the sha256 of the arguments shown above
    ]
    _command(out, ["durably"], *parts)
    decided = subprocess.run(
        [sys.executable, "-m", "durably.cli", *(arg for part in parts for arg in part)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    _para(out, (decided.stdout + decided.stderr).strip())
    out.print()
    return p if decided.returncode == 0 else None


def _print_model_calls(out: Console, log: list[dict[str, Any]], phases: list[int]) -> bool:
    """Each model request: its turn, key, what the model asked, in which step of the demo.

    ``phases`` holds how many requests were logged at the end of steps 1, 3
    and 4. True when no turn was asked twice.
    """
    counts = collections.Counter(r["turn"] for r in log)
    for i, r in enumerate(log):
        step = (1, 3, 4)[min(sum(i >= n for n in phases), 2)]
        reply = r.get("reply") or {}
        asks = [c["function"]["name"] for c in reply.get("tool_calls") or []]
        what = ", ".join(asks) if asks else "final answer"
        out.print(
            f"   turn {r['turn']}  key {r['idempotency_key']:<20}  -> {what:<12}"
            f"  asked {counts[r['turn']]}x, in step {step}",
            soft_wrap=True,
            markup=False,
        )
    repeated = sorted(t for t, n in counts.items() if n > 1)
    verdict = f"[red]turns asked twice: {repeated}[/red]" if repeated else "none asked twice"
    out.print(f"   => {len(log)} requests for {len(counts)} turns, {verdict}")
    return not repeated


def agent_demo(where: Places, out: Console) -> int:
    """The model-driven agent: park for approval, approve elsewhere, kill, recover."""
    from durably.testing.models import FakeModelServer, read_log

    database = where.url
    folder = where.work
    model_log = folder / "model.log"
    real = bool(os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_API_KEY"))
    model_name = (os.environ.get("OPENAI_MODEL") if real else None) or DEFAULT_MODEL
    fake = None if real else FakeModelServer(model_script(), log_path=model_log)
    phases: list[int] = []
    with payments.FakePaymentsServer(folder / "payments.log", flavour="idempotent") as pay:
        env = {**_base_env(pay.url, folder / "outbox.log"), MODEL_ENV: model_name}
        out.print("[bold]durably demo[/bold]: a refund agent, approved, killed, recovered")
        out.print(f"database: {where.database}", markup=False, soft_wrap=True)
        if fake is not None:
            env[MODEL_URL_ENV] = fake.start().url
            model = f"model: FakeModelServer on {fake.url} (scripted, no API key)"
        else:
            model = f"model: {model_name} at {os.environ['OPENAI_BASE_URL']} (real: billed)"
        _para(out, model, indent="")
        _para(out, f"payments service on {pay.url} (honours Idempotency-Key)", indent="")
        out.print()
        try:
            out.print("[bold]1. the agent runs until the refund needs a person[/bold]")
            code = _spawn("park", database, env)
            out.print(f"   agent process exited with {code}\n")
            phases.append(len(read_log(model_log)))

            out.print("[bold]2. a person approves it, from another process[/bold]")
            approval = _approve(out, database, env)
            if approval is None:
                return 1

            step = f"tool:issue_refund:{approval.tool_call_id}"
            out.print("[bold]3. the agent resumes; SIGKILL arrives inside issue_refund[/bold]")
            _para(
                out,
                "(after the payment call returned, before the tool's receipt was committed: "
                f"DURABLY_CRASH_AT=after_call:{step})",
            )
            crash = {
                **env,
                "DURABLY_CRASH_AT": f"after_call:{step}",
                "DURABLY_CRASH_ONCE": str(folder / "crashed"),
            }
            code = _spawn("run", database, crash)
            out.print(f"   agent process exited with {code} ({_exit_text(code)})\n")
            phases.append(len(read_log(model_log)))
            killed_at = time.time()

            out.print("[bold]4. a new process starts and recovers the workflow[/bold]")
            code = _spawn("run", database, env)
            out.print(f"   agent process exited with {code} after {time.time() - killed_at:.1f}s\n")
            phases.append(len(read_log(model_log)))
        finally:
            if fake is not None:
                fake.stop()
        one_refund = _print_payments(out, folder / "payments.log", "5. the payments log")

    with durably.Client(database) as client:
        info = client.get_workflow(WORKFLOW_ID)
        decision = client.get_event(WORKFLOW_ID, f"approval:{approval.approval_id}")
    result = json.loads(info.output) if info.status == "completed" and info.output else {}

    out.print("[bold]6. the model calls[/bold]")
    once = True
    if fake is not None:
        once = _print_model_calls(out, read_log(model_log), phases)
    else:
        out.print("   (a real endpoint: no request log to count)")
    _para(out, result.get("usage", "no usage: the workflow did not complete"), style="bold")
    out.print()

    out.print("[bold]7. the approval[/bold]")
    at = str(decision.get("decided_at") or "")
    when = at.replace("T", " ")[:19] + " UTC" if at else "?"
    by = decision.get("decided_by")
    _para(out, f"{decision.get('status')} by {by} at {when}: {approval.describe()}")
    out.print()

    info = _print_receipts(out, database, "8. the receipts")
    if "output" in result:
        _para(out, f"answer: {result['output']}")
    ok = one_refund and once and info.status == "completed" and by == APPROVER
    out.print(
        "\n[green]one refund, and no model call paid twice, as promised.[/green]"
        if ok
        else "\n[red]something is wrong: see above[/red]"
    )
    return 0 if ok else 1


def scripted_demo(where: Places, out: Console) -> int:
    """The scripted agent (no model): killed inside the refund, recovered, one refund."""
    database = where.url
    folder = where.work
    log = folder / "payments.log"
    with payments.FakePaymentsServer(log, flavour="idempotent") as server:
        env = _base_env(server.url, folder / "outbox.log")
        out.print("[bold]durably demo --scripted[/bold]: a refund agent, killed, recovered")
        out.print(f"database: {where.database}", markup=False, soft_wrap=True)
        _para(out, f"payments service on {server.url} (honours Idempotency-Key)", indent="")
        out.print()
        out.print("[bold]1. the agent runs; SIGKILL arrives inside issue_refund[/bold]")
        out.print("   (after the payment call returned, before the receipt was committed)")
        crash = {
            **env,
            "DURABLY_CRASH_AT": "after_call:issue_refund",
            "DURABLY_CRASH_ONCE": str(folder / "crashed"),
        }
        code = _spawn("scripted", database, crash)
        out.print(f"   agent process exited with {code} ({_exit_text(code)})\n")
        killed_at = time.time()
        out.print("[bold]2. a new process starts and recovers the workflow[/bold]")
        code = _spawn("scripted", database, env)
        out.print(f"   agent process exited with {code} after {time.time() - killed_at:.1f}s\n")
    ok = _print_payments(out, log, "3. the payments log")
    _print_receipts(out, database, "4. the receipts")
    out.print(
        "\n[green]one refund, as promised.[/green]" if ok else "\n[red]refund count is wrong[/red]"
    )
    return 0 if ok else 1


def cli_main(argv: list[str] | None = None) -> int:
    """``python -m durably.demo [--scripted] [--workdir DIR]`` (and the demo's own children)."""
    parser = argparse.ArgumentParser(prog="python -m durably.demo")
    parser.add_argument("--scripted", action="store_true", help="the scripted agent, no model")
    parser.add_argument("--workdir", default=None, help="keep the files here")
    parser.add_argument("--child", choices=("scripted", "park", "run"), help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        return asyncio.run(_child(ns.child, ns.database))
    return main(ns.workdir, scripted=ns.scripted)


if __name__ == "__main__":
    sys.exit(cli_main())
