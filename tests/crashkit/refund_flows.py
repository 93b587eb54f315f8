"""The refund agent of the seeds with each side-effect policy, and compensating checkouts.

Imported by the test process and by child processes (``durably.testing.crashes``
runs them as ``tests.crashkit.refund_flows:WORKFLOW``). Every effect goes to a
real :class:`~durably.testing.payments.FakePaymentsServer` whose URL is in
``REFUND_FLOWS_PAYMENTS``; the tests count its log, never durably's.

- ``refund_flow(order_id, policy, reconcile_mode)``: look the order up, refund it
  through a step named ``issue_refund`` whose policy is ``"plain"`` (retried with
  its idempotency key), ``"reconcile"`` (asks ``GET /refunds?idempotency_key=``
  first; ``reconcile_mode`` makes the reconcile function answer ``NotFound``,
  ``Unknown`` or raise instead) or ``"at_most_once"``; then send a receipt. A
  refund a person resolved as failed is caught and reported in the result.
- ``checkout(order_id)``: charge, hold a deposit, each with a compensating refund,
  then shipping fails: the compensations run newest first and the workflow fails
  with ``ShippingFailed``.
- ``checkout_awaiting_confirmation(order_id)``: the same, but it waits for a
  ``confirm`` signal, so a test can cancel it while it waits.
"""

from __future__ import annotations

import json
import os
from typing import Any

import durably
from durably.testing import payments

PAYMENTS_ENV = "REFUND_FLOWS_PAYMENTS"
CENTS = 12_000
DEPOSIT = 500
OUTBOX = "outbox.jsonl"


def _payments() -> str:
    return os.environ[PAYMENTS_ENV]


def _refund(order_id: str, cents: int) -> dict[str, Any]:
    """One POST /refunds carrying this step's idempotency key."""
    return dict(
        payments.refund(_payments(), order_id, cents, idempotency_key=durably.idempotency_key())
    )


# --- the refund agent ---------------------------------------------------------------------


@durably.step
def lookup_order(order_id: str) -> dict[str, Any]:
    """Read the order (a pure step: no side effect)."""
    return {"order_id": order_id, "cents": CENTS, "customer": "ada@example.com"}


@durably.step(name="issue_refund")
def issue_refund_plain(order_id: str, cents: int) -> dict[str, Any]:
    """Refund; on a crash, run again with the same key (the service deduplicates)."""
    return _refund(order_id, cents)


def find_refund(key: str, order_id: str, cents: int, mode: str) -> Any:
    """Reconcile ``issue_refund``: ask the payments service whether the key made a refund.

    ``mode`` other than ``"lookup"`` stands for a reconcile function that cannot
    tell (``"unknown"``), wrongly says no (``"notfound"``), or fails (``"raise"``).
    """
    if mode == "notfound":
        return durably.NotFound
    if mode == "unknown":
        return durably.Unknown
    if mode == "raise":
        raise RuntimeError("the payments lookup endpoint is down")
    found = payments.find_refund(_payments(), key)
    return durably.Found(dict(found)) if found is not None else durably.NotFound


@durably.step(name="issue_refund", reconcile=find_refund)
def issue_refund_reconciled(order_id: str, cents: int, mode: str) -> dict[str, Any]:
    """Refund; on a crash, ``find_refund`` decides whether it happened."""
    return _refund(order_id, cents)


@durably.step(name="issue_refund", at_most_once=True)
def issue_refund_once(order_id: str, cents: int) -> dict[str, Any]:
    """Refund; never repeated automatically: a crash parks the workflow for a person."""
    return _refund(order_id, cents)


@durably.step
def send_receipt(customer: str, refund_id: str) -> str:
    """Email the customer: one line in ``outbox.jsonl`` of the crash-test scenario, if any."""
    key = durably.idempotency_key()
    folder = os.environ.get("DURABLY_SCENARIO_DIR")
    if folder:
        line = {"idempotency_key": key, "to": customer, "refund_id": refund_id}
        with open(os.path.join(folder, OUTBOX), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
    return f"msg-{key}"


@durably.workflow(name="refund-flow")
async def refund_flow(
    order_id: str, policy: str = "plain", reconcile_mode: str = "lookup"
) -> dict[str, Any]:
    """Order -> refund (under ``policy``) -> receipt."""
    order = await lookup_order(order_id)
    try:
        if policy == "plain":
            refund = await issue_refund_plain(order_id, order["cents"])
        elif policy == "reconcile":
            refund = await issue_refund_reconciled(order_id, order["cents"], reconcile_mode)
        elif policy == "at_most_once":
            refund = await issue_refund_once(order_id, order["cents"])
        else:
            raise ValueError(f"unknown policy {policy!r}")
    except durably.ResolvedAsFailed as exc:
        return {"refund_id": None, "failed": str(exc)}
    message = await send_receipt(order["customer"], refund["refund_id"])
    return {"refund_id": refund["refund_id"], "refund": refund, "message": message}


# --- compensation -------------------------------------------------------------------------


class ShippingFailed(Exception):
    """The carrier refused the parcel: the step that makes a checkout undo itself."""


@durably.step
def charge_card(order_id: str, cents: int) -> dict[str, Any]:
    """Take the payment (no outside effect here; its undo is a real refund)."""
    return {"charge_id": f"ch-{order_id}", "cents": cents}


@durably.step
def hold_deposit(order_id: str, cents: int) -> dict[str, Any]:
    """Hold a deposit (no outside effect here; its undo is a real refund)."""
    return {"hold_id": f"hold-{order_id}", "cents": cents}


@durably.step
def ship(order_id: str) -> str:
    """Always fails: the carrier rejects the parcel."""
    raise ShippingFailed(f"carrier rejected {order_id}")


def refund_card(order_id: str, cents: int) -> dict[str, Any]:
    """Undo ``charge_card``: refund the card (run as step ``compensate:refund_card``)."""
    return _refund(f"{order_id}-card", cents)


def refund_deposit(order_id: str, cents: int) -> dict[str, Any]:
    """Undo ``hold_deposit``: refund the deposit (step ``compensate:refund_deposit``)."""
    return _refund(f"{order_id}-deposit", cents)


@durably.workflow(name="checkout")
async def checkout(order_id: str) -> str:
    """Charge, hold, ship; shipping fails, so the deposit then the card are refunded."""
    await charge_card(order_id, CENTS)
    durably.compensate(refund_card, order_id, CENTS)
    await hold_deposit(order_id, DEPOSIT)
    durably.compensate(refund_deposit, order_id, DEPOSIT)
    return await ship(order_id)


@durably.workflow(name="checkout-awaiting-confirmation")
async def checkout_awaiting_confirmation(order_id: str) -> str:
    """Charge, hold, then wait for ``confirm``: cancelling it refunds both."""
    await charge_card(order_id, CENTS)
    durably.compensate(refund_card, order_id, CENTS)
    await hold_deposit(order_id, DEPOSIT)
    durably.compensate(refund_deposit, order_id, DEPOSIT)
    await durably.wait_for_signal("confirm")
    return f"shipped {order_id}"
