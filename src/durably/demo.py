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

Files (in the work directory): ``demo.db``, ``payments.log``, ``model.log`` (the
fake model server's requests) and ``outbox.log`` (the emails), all JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

import durably
from durably.agents import PendingApproval
from durably.testing import payments

WORKFLOW_ID = "refund-TCK-4417"
DEFAULT_MODEL = "gpt-4.1-mini"
APPROVER = "demo"

PAYMENTS_ENV = "DURABLY_DEMO_PAYMENTS"
OUTBOX_ENV = "DURABLY_DEMO_OUTBOX"
MODEL_URL_ENV = "DURABLY_DEMO_MODEL_URL"  # set: the fake model server; unset: OPENAI_* env
MODEL_ENV = "DURABLY_DEMO_MODEL"

TICKETS: dict[str, dict[str, Any]] = {
    "TCK-4417": {
        "ticket_id": "TCK-4417",
        "customer": "ada@example.com",
        "order_id": "ORD-9912",
        "text": "My order ORD-9912 arrived broken. I'd like my $120 back.",
    }
}

ORDERS: dict[str, dict[str, Any]] = {
    "ORD-9912": {
        "order_id": "ORD-9912",
        "customer": "ada@example.com",
        "item": "espresso machine",
        "total": "120.00",
        "currency": "USD",
        "status": "delivered (reported broken)",
    }
}

INSTRUCTIONS = (
    "You are a support agent for an online shop. Read the ticket with get_ticket, "
    "look up its order with lookup_order, refund what the customer is owed with "
    "issue_refund (amount in US dollars), email the customer with send_email, then "
    "answer with one sentence saying what you did."
)


def _say(text: str) -> None:
    print(f"    {text}", flush=True)


# --- the model-driven agent ------------------------------------------------------------


@durably.tool
async def get_ticket(ticket_id: str) -> dict[str, Any]:
    """Read a support ticket.

    Args:
        ticket_id: The ticket's id, e.g. TCK-4417.
    """
    _say(f"tool get_ticket({ticket_id})")
    if ticket_id not in TICKETS:
        raise durably.ToolError(f"no ticket {ticket_id}")
    return TICKETS[ticket_id]


@durably.tool
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: customer, item, total paid and status.

    Args:
        order_id: The order's id, e.g. ORD-9912.
    """
    _say(f"tool lookup_order({order_id})")
    if order_id not in ORDERS:
        raise durably.ToolError(f"no order {order_id}")
    return ORDERS[order_id]


@durably.tool(
    requires_approval=lambda a: float(a["amount"]) > 100,
    retry=durably.Retry(max_attempts=3, initial=0.2),
)
def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order to the customer's card. Refunds over $100 wait for a person's approval.

    Args:
        order_id: The order to refund, e.g. ORD-9912.
        amount: The amount in US dollars, e.g. 120.00; at most the order's total.
    """
    order = ORDERS.get(order_id)
    if order is None:
        raise durably.ToolError(f"no order {order_id}")
    cents = Decimal(f"{amount:.2f}")
    if cents <= 0 or cents > Decimal(order["total"]):
        raise durably.ToolError(f"amount must be between 0.01 and {order['total']}")
    key = durably.idempotency_key()
    _say(f"tool issue_refund({order_id}, {cents}) Idempotency-Key: {key}")
    result = payments.refund(os.environ[PAYMENTS_ENV], order_id, str(cents), idempotency_key=key)
    _say(f"payments answered refund_id={result['refund_id']}")
    return result


@durably.tool
def send_email(to: str, body: str) -> dict[str, Any]:
    """Email a customer.

    Args:
        to: The customer's email address.
        body: The message.
    """
    key = durably.idempotency_key()
    _say(f"tool send_email({to})")
    line = {"to": to, "body": body, "key": key, "pid": os.getpid()}
    with open(os.environ[OUTBOX_ENV], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return {"message_id": f"msg-{key}", "to": to}


@functools.cache
def agent() -> durably.Agent:
    """The agent of this process: the fake model server, or the OPENAI_* endpoint."""
    from openai import AsyncOpenAI

    fake = os.environ.get(MODEL_URL_ENV)
    if fake:
        client = AsyncOpenAI(base_url=fake, api_key="demo", max_retries=0)
    else:  # OPENAI_BASE_URL and OPENAI_API_KEY, read by the client
        client = AsyncOpenAI(max_retries=0)
    return durably.Agent(
        client=client,
        model=os.environ.get(MODEL_ENV) or DEFAULT_MODEL,
        instructions=INSTRUCTIONS,
        tools=[get_ticket, lookup_order, issue_refund, send_email],
        max_turns=12,
    )


@durably.workflow(name="support-agent")
async def support_agent(ticket_id: str) -> dict[str, Any]:
    """The model handles the ticket; the result says what the model calls cost."""
    result = await agent().run(f"Please handle support ticket {ticket_id}.")
    return {
        "output": result.output,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "usage": result.usage.summary(),
        "billed": dataclasses.asdict(result.usage.billed),
        "replayed": dataclasses.asdict(result.usage.replayed),
    }


def model_script() -> Any:
    """What the fake model answers, by turn: the same turn always gets the same answer."""
    from durably.testing.models import by_turn, call, text, tool_calls

    email = (
        "Hello Ada, we are sorry your espresso machine arrived broken. We refunded "
        "$120.00 for order ORD-9912 to your card; it shows within 5 business days."
    )
    return by_turn(
        [
            tool_calls(call("get_ticket", {"ticket_id": "TCK-4417"}, id="call_ticket")),
            tool_calls(call("lookup_order", {"order_id": "ORD-9912"}, id="call_order")),
            tool_calls(
                call("issue_refund", {"order_id": "ORD-9912", "amount": 120.00}, id="call_refund")
            ),
            tool_calls(
                call("send_email", {"to": "ada@example.com", "body": email}, id="call_email")
            ),
            text("I refunded $120.00 for ORD-9912 and emailed ada@example.com."),
        ]
    )


# --- the scripted agent (durably demo --scripted) -----------------------------------------


@durably.step(name="get_ticket")
async def scripted_get_ticket(ticket_id: str) -> dict[str, Any]:
    """Read the support ticket."""
    _say(f"get_ticket({ticket_id})")
    return TICKETS[ticket_id]


@durably.step(name="classify_intent")
async def scripted_classify_intent(ticket: dict[str, Any]) -> dict[str, Any]:
    """Decide what to do: a scripted plan standing in for a model call."""
    _say("classify_intent -> refund")
    return {"intent": "refund", "order_id": ticket["order_id"], "amount": Decimal("120.00")}


@durably.step(name="issue_refund", retry=durably.Retry(max_attempts=3, initial=0.2))
def scripted_issue_refund(order_id: str, amount: Decimal) -> dict[str, Any]:
    """Refund through the payments service, keyed by this step's idempotency key."""
    key = durably.idempotency_key()
    _say(f"issue_refund({order_id}, {amount}) Idempotency-Key: {key}")
    result = payments.refund(os.environ[PAYMENTS_ENV], order_id, str(amount), idempotency_key=key)
    _say(f"payments answered refund_id={result['refund_id']}")
    return result


@durably.step(name="send_email")
def scripted_send_email(to: str, body: str) -> str:
    """Send the confirmation (appended to an outbox file)."""
    _say(f"send_email({to})")
    with open(os.environ[OUTBOX_ENV], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"to": to, "body": body, "key": durably.idempotency_key()}) + "\n")
    return f"msg-{durably.idempotency_key()}"


@durably.workflow(name="refund-agent")
async def refund_agent(ticket_id: str) -> dict[str, Any]:
    """Ticket -> plan -> refund -> email."""
    ticket = await scripted_get_ticket(ticket_id)
    plan = await scripted_classify_intent(ticket)
    refund = await scripted_issue_refund(plan["order_id"], plan["amount"])
    message = await scripted_send_email(
        ticket["customer"], f"We refunded ${plan['amount']} ({refund['refund_id']})."
    )
    return {"refund_id": refund["refund_id"], "email": message}


# --- the child processes ----------------------------------------------------------------------


async def _child(role: str, database: str) -> int:
    """Run the workflow in this process: ``scripted``, ``park`` (until waiting) or ``run``."""
    if role == "scripted":
        async with durably.Engine(database) as engine:
            handle = await engine.start(refund_agent, "TCK-4417", workflow_id=WORKFLOW_ID)
            result = await handle.result()
        print(f"    workflow completed: {json.dumps(result)}", flush=True)
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
        print(f"    workflow completed: {result['output']}", flush=True)
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


def main(
    workdir: str | None = None, console: Console | None = None, *, scripted: bool = False
) -> int:
    """Run the demo; 0 when there is exactly one refund (and, with a model, no turn paid twice)."""
    out = console or Console(highlight=False)
    folder = Path(workdir or tempfile.mkdtemp(prefix="durably-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    if not scripted and _openai_missing():
        out.print(
            "[yellow]openai is not installed[/yellow] (pip install -e '.\\[agents]'); "
            "running the scripted demo instead (durably demo --scripted)\n"
        )
        scripted = True
    if scripted:
        return scripted_demo(folder, out)
    return agent_demo(folder, out)


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
    out.print(f"[bold]{title}[/bold]")
    for r in requests:
        out.print(
            f"   POST {r['path']}  Idempotency-Key: {r['idempotency_key']}  "
            f"refund_id={r['refund_id']}  {'new refund' if r['created'] else 'replayed'}",
            soft_wrap=True,
        )
    out.print(
        f"   => {len(requests)} requests, {len(keys)} key, [bold]{len(refunds)} refund[/bold]\n"
    )
    return len(refunds) == 1 and len(keys) == 1


def _print_receipts(out: Console, database: str, title: str) -> durably.WorkflowInfo:
    from durably import cli

    out.print(f"[bold]{title}[/bold]  (durably show {WORKFLOW_ID})")
    with durably.Client(database) as client:
        info = client.get_workflow(WORKFLOW_ID)
        cli.print_receipts(info, client.history(WORKFLOW_ID), client.claims(WORKFLOW_ID))
    return info


def _approve(out: Console, database: str, env: dict[str, str]) -> PendingApproval | None:
    """Show the pending approval, then approve it with ``durably approve`` in another process."""
    with durably.Client(database) as client:
        pending = client.list_approvals(WORKFLOW_ID)
    if len(pending) != 1 or pending[0].tool != "issue_refund":
        found = ", ".join(p.describe() for p in pending) or "none"
        out.print(f"[red]expected one pending issue_refund; found {escape(found)}[/red]")
        return None
    [p] = pending
    out.print(f"   pending: [bold]{escape(p.describe())}[/bold]", soft_wrap=True)
    out.print(f"            call {p.tool_call_id}, arguments sha256 {p.args_sha256[:16]}…")
    argv = ["--database", database, "approve", WORKFLOW_ID, "--by", APPROVER]
    out.print(
        f"   $ durably {escape(' '.join(argv))} --expect {p.args_sha256[:8]}…", soft_wrap=True
    )
    decided = subprocess.run(
        [sys.executable, "-m", "durably.cli", *argv, "--expect", p.args_sha256],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out.print(f"   {escape((decided.stdout + decided.stderr).strip())}\n", soft_wrap=True)
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
            f"   turn {r['turn']}  Idempotency-Key: {r['idempotency_key']:<20}  -> {what:<12}"
            f"  asked {counts[r['turn']]}x, in step {step}",
            soft_wrap=True,
            markup=False,
        )
    repeated = sorted(t for t, n in counts.items() if n > 1)
    verdict = f"[red]turns asked twice: {repeated}[/red]" if repeated else "none asked twice"
    out.print(f"   => {len(log)} requests for {len(counts)} turns, {verdict}")
    return not repeated


def agent_demo(folder: Path, out: Console) -> int:
    """The model-driven agent: park for approval, approve elsewhere, kill, recover."""
    from durably.testing.models import FakeModelServer, read_log

    database = f"sqlite:///{folder / 'demo.db'}"
    model_log = folder / "model.log"
    real = bool(os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_API_KEY"))
    model_name = (os.environ.get("OPENAI_MODEL") if real else None) or DEFAULT_MODEL
    fake = None if real else FakeModelServer(model_script(), log_path=model_log)
    phases: list[int] = []
    with payments.FakePaymentsServer(folder / "payments.log", flavour="idempotent") as pay:
        env = {**_base_env(pay.url, folder / "outbox.log"), MODEL_ENV: model_name}
        out.print(f"[bold]durably demo[/bold]: files in {escape(str(folder))}")
        if fake is not None:
            env[MODEL_URL_ENV] = fake.start().url
            where = f"FakeModelServer on {fake.url} (scripted by turn, no API key)"
        else:
            where = f"{model_name} at {os.environ['OPENAI_BASE_URL']} (a real endpoint: billed)"
        out.print(f"model: {escape(where)}", soft_wrap=True)
        out.print(f"payments service on {pay.url} (honours Idempotency-Key)\n")
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
            out.print("   (after the payment call returned, before the tool's receipt")
            out.print(f"   was committed: DURABLY_CRASH_AT=after_call:{step})", soft_wrap=True)
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
    usage = result.get("usage", "no usage: the workflow did not complete")
    out.print(f"   [bold]{escape(usage)}[/bold]\n", soft_wrap=True)

    out.print("[bold]7. the approval[/bold]")
    at = str(decision.get("decided_at") or "")
    when = at.replace("T", " ")[:19] + " UTC" if at else "?"
    by = decision.get("decided_by")
    line = f"{decision.get('status')} by {by} at {when}: {approval.describe()}"
    out.print(f"   {escape(line)}\n", soft_wrap=True)

    info = _print_receipts(out, database, "8. the receipts")
    ok = one_refund and once and info.status == "completed" and by == APPROVER
    out.print(
        "\n[green]one refund, and no model call paid twice, as promised.[/green]"
        if ok
        else "\n[red]something is wrong: see above[/red]"
    )
    return 0 if ok else 1


def scripted_demo(folder: Path, out: Console) -> int:
    """The scripted agent (no model): killed inside the refund, recovered, one refund."""
    database = f"sqlite:///{folder / 'demo.db'}"
    log = folder / "payments.log"
    with payments.FakePaymentsServer(log, flavour="idempotent") as server:
        env = _base_env(server.url, folder / "outbox.log")
        out.print(f"[bold]durably demo --scripted[/bold]: files in {escape(str(folder))}")
        out.print(f"payments service on {server.url} (honours Idempotency-Key)\n")
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
