"""The demo's agents: the refund agent driven by a model, and the scripted one.

The tools call the fake payments service named by ``DURABLY_DEMO_PAYMENTS`` and
append emails to ``DURABLY_DEMO_OUTBOX``; :mod:`durably.demo` runs these
workflows in child processes, kills one and recovers it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import textwrap
from decimal import Decimal
from typing import Any

import durably
from durably.testing import payments

WIDTH = 80  # the widest line the demo prints (a long path aside)
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


def say(text: str) -> None:
    """Print a line of a child process, wrapped to the demo's width and indented."""
    lines = textwrap.wrap(
        text,
        WIDTH,
        initial_indent="    ",
        subsequent_indent="      ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    print("\n".join(lines), flush=True)


def _dollars(amount: str) -> Decimal | None:
    """An amount in US dollars as the model wrote it ("120.00"), or None if it is not one."""
    try:
        value = Decimal(amount)
    except ArithmeticError:
        return None
    return value.quantize(Decimal("0.01")) if value.is_finite() else None


# --- the model-driven agent ------------------------------------------------------------


@durably.tool
async def get_ticket(ticket_id: str) -> dict[str, Any]:
    """Read a support ticket.

    Args:
        ticket_id: The ticket's id, e.g. TCK-4417.
    """
    say(f"tool get_ticket({ticket_id})")
    if ticket_id not in TICKETS:
        raise durably.ToolError(f"no ticket {ticket_id}")
    return TICKETS[ticket_id]


@durably.tool
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: customer, item, total paid and status.

    Args:
        order_id: The order's id, e.g. ORD-9912.
    """
    say(f"tool lookup_order({order_id})")
    if order_id not in ORDERS:
        raise durably.ToolError(f"no order {order_id}")
    return ORDERS[order_id]


def _needs_approval(args: dict[str, Any]) -> bool:
    """Refunds over $100 (and amounts that are not amounts, which the tool refuses) wait."""
    dollars = _dollars(str(args["amount"]))
    return dollars is None or dollars > 100


@durably.tool(requires_approval=_needs_approval, retry=durably.Retry(max_attempts=3, initial=0.2))
def issue_refund(order_id: str, amount: str) -> dict[str, Any]:
    """Refund an order to the customer's card. Refunds over $100 wait for a person's approval.

    Args:
        order_id: The order to refund, e.g. ORD-9912.
        amount: The amount in US dollars with two decimals, e.g. "120.00"; at most the
            order's total.
    """
    order = ORDERS.get(order_id)
    if order is None:
        raise durably.ToolError(f"no order {order_id}")
    dollars = _dollars(amount)
    if dollars is None or dollars <= 0 or dollars > Decimal(order["total"]):
        raise durably.ToolError(f"amount must be between 0.01 and {order['total']}")
    key = durably.idempotency_key()
    say(f"tool issue_refund({order_id}, {dollars}) Idempotency-Key: {key}")
    result = payments.refund(os.environ[PAYMENTS_ENV], order_id, str(dollars), idempotency_key=key)
    say(f"payments answered refund_id={result['refund_id']}")
    return result


@durably.tool
def send_email(to: str, body: str) -> dict[str, Any]:
    """Email a customer.

    Args:
        to: The customer's email address.
        body: The message.
    """
    key = durably.idempotency_key()
    say(f"tool send_email({to})")
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
                call("issue_refund", {"order_id": "ORD-9912", "amount": "120.00"}, id="call_refund")
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
    say(f"get_ticket({ticket_id})")
    return TICKETS[ticket_id]


@durably.step(name="classify_intent")
async def scripted_classify_intent(ticket: dict[str, Any]) -> dict[str, Any]:
    """Decide what to do: a scripted plan standing in for a model call."""
    say("classify_intent -> refund")
    return {"intent": "refund", "order_id": ticket["order_id"], "amount": Decimal("120.00")}


@durably.step(name="issue_refund", retry=durably.Retry(max_attempts=3, initial=0.2))
def scripted_issue_refund(order_id: str, amount: Decimal) -> dict[str, Any]:
    """Refund through the payments service, keyed by this step's idempotency key."""
    key = durably.idempotency_key()
    say(f"issue_refund({order_id}, {amount}) Idempotency-Key: {key}")
    result = payments.refund(os.environ[PAYMENTS_ENV], order_id, str(amount), idempotency_key=key)
    say(f"payments answered refund_id={result['refund_id']}")
    return result


@durably.step(name="send_email")
def scripted_send_email(to: str, body: str) -> str:
    """Send the confirmation (appended to an outbox file)."""
    say(f"send_email({to})")
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
