"""``durably demo``: the refund agent of the seeds, killed inside the refund.

The agent reads ticket TCK-4417, follows a scripted plan, refunds $120.00 on
order ORD-9912 through a fake payments service (a real HTTP server on
127.0.0.1 that logs every request and honours Idempotency-Key), and emails the
customer. The first agent process is killed with SIGKILL inside issue_refund,
after the payment call returned and before the step's receipt was committed.
A second process recovers it. The payments log then shows two requests with
one key and one refund, and the receipts show where the process was dead.
"""

from __future__ import annotations

import asyncio
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

import durably
from durably.testing import payments

WORKFLOW_ID = "refund-TCK-4417"

TICKETS: dict[str, dict[str, Any]] = {
    "TCK-4417": {
        "ticket_id": "TCK-4417",
        "customer": "ada@example.com",
        "order_id": "ORD-9912",
        "text": "My order ORD-9912 arrived broken. I'd like my $120 back.",
    }
}


def _say(text: str) -> None:
    print(f"    {text}", flush=True)


@durably.step
async def get_ticket(ticket_id: str) -> dict[str, Any]:
    """Read the support ticket."""
    _say(f"get_ticket({ticket_id})")
    return TICKETS[ticket_id]


@durably.step
async def classify_intent(ticket: dict[str, Any]) -> dict[str, Any]:
    """Decide what to do: a scripted plan standing in for a model call."""
    _say("classify_intent -> refund")
    return {"intent": "refund", "order_id": ticket["order_id"], "amount": Decimal("120.00")}


@durably.step(retry=durably.Retry(max_attempts=3, initial=0.2))
def issue_refund(order_id: str, amount: Decimal) -> dict[str, Any]:
    """Refund through the payments service, keyed by this step's idempotency key."""
    key = durably.idempotency_key()
    _say(f"issue_refund({order_id}, {amount}) Idempotency-Key: {key}")
    result = payments.refund(
        os.environ["DURABLY_DEMO_PAYMENTS"], order_id, str(amount), idempotency_key=key
    )
    _say(f"payments answered refund_id={result['refund_id']}")
    return result


@durably.step
def send_email(to: str, body: str) -> str:
    """Send the confirmation (appended to an outbox file)."""
    _say(f"send_email({to})")
    with open(os.environ["DURABLY_DEMO_OUTBOX"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"to": to, "body": body, "key": durably.idempotency_key()}) + "\n")
    return f"msg-{durably.idempotency_key()}"


@durably.workflow(name="refund-agent")
async def refund_agent(ticket_id: str) -> dict[str, Any]:
    """Ticket -> plan -> refund -> email."""
    ticket = await get_ticket(ticket_id)
    plan = await classify_intent(ticket)
    refund = await issue_refund(plan["order_id"], plan["amount"])
    message = await send_email(
        ticket["customer"], f"We refunded ${plan['amount']} ({refund['refund_id']})."
    )
    return {"refund_id": refund["refund_id"], "email": message}


async def _agent(database: str) -> None:
    async with durably.Engine(database) as engine:
        handle = await engine.start(refund_agent, "TCK-4417", workflow_id=WORKFLOW_ID)
        result = await handle.result()
    print(f"    workflow completed: {json.dumps(result)}", flush=True)


def _run_agent(database: str, env: dict[str, str]) -> int:
    proc = subprocess.run([sys.executable, "-m", "durably.demo", database], env=env, check=False)
    return proc.returncode


def main(workdir: str | None = None, console: Console | None = None) -> int:
    """Run the demo; return 0 when the payments log shows exactly one refund."""
    from durably import cli

    out = console or Console(highlight=False)
    folder = Path(workdir or tempfile.mkdtemp(prefix="durably-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    database = f"sqlite:///{folder / 'demo.db'}"
    log = folder / "payments.log"
    outbox = folder / "outbox.log"
    with payments.FakePaymentsServer(log, flavour="idempotent") as server:
        env = {
            **os.environ,
            "DURABLY_DEMO_PAYMENTS": server.url,
            "DURABLY_DEMO_OUTBOX": str(outbox),
        }
        out.print(f"[bold]durably demo[/bold]: files in {folder}")
        out.print(f"payments service on {server.url} (honours Idempotency-Key)\n")
        out.print("[bold]1. the agent runs; SIGKILL arrives inside issue_refund[/bold]")
        out.print("   (after the payment call returned, before the receipt was committed)")
        crash = {
            **env,
            "DURABLY_CRASH_AT": "after_call:issue_refund",
            "DURABLY_CRASH_ONCE": str(folder / "crashed"),
        }
        code = _run_agent(database, crash)
        out.print(
            f"   agent process exited with {code} ({'SIGKILL' if code == -9 else 'no kill'})\n"
        )
        killed_at = time.time()
        out.print("[bold]2. a new process starts and recovers the workflow[/bold]")
        code = _run_agent(database, env)
        out.print(f"   agent process exited with {code} after {time.time() - killed_at:.1f}s\n")
        requests = [r for r in payments.read_log(log) if r.get("method") == "POST"]
        refunds = payments.refunds_in_log(log)
    keys = {r.get("idempotency_key") for r in requests}
    out.print("[bold]3. the payments log[/bold]")
    for r in requests:
        out.print(
            f"   POST {r['path']}  Idempotency-Key: {r['idempotency_key']}  "
            f"refund_id={r['refund_id']}  {'new refund' if r['created'] else 'replayed'}",
            soft_wrap=True,
        )
    out.print(
        f"   => {len(requests)} requests, {len(keys)} key, [bold]{len(refunds)} refund[/bold]\n"
    )
    out.print("[bold]4. the receipts[/bold]  (durably show " + WORKFLOW_ID + ")")
    with durably.Client(database) as client:
        cli.print_receipts(
            client.get_workflow(WORKFLOW_ID),
            client.history(WORKFLOW_ID),
            client.claims(WORKFLOW_ID),
        )
    ok = len(refunds) == 1 and len(keys) == 1
    out.print(
        "\n[green]one refund, as promised.[/green]" if ok else "\n[red]refund count is wrong[/red]"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    asyncio.run(_agent(sys.argv[1]))
