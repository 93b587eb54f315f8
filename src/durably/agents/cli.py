"""Command-line approvals (``approvals``, ``approve``, ``reject``) and budgets (``budget``).

The commands take the database URL as click's context object and are mounted
in the ``durably`` command line (``durably approvals``, ``durably approve ID``,
``durably reject ID``); ``python -m durably.agents`` is the same command line.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from durably import client as client_module
from durably import errors
from durably.agents import budget, decisions, exceptions
from durably.cli.base import _fail


def _client(database: str) -> client_module.Client:
    # Every command here needs a workflow that exists: never create a database.
    return client_module.Client(database, create=False)


@click.command("approvals")
@click.argument("workflow_id", required=False)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line (as GET /api/approvals)."
)
@click.pass_obj
def approvals_cmd(database: str, workflow_id: str | None, as_json: bool) -> None:
    """List tool calls waiting for approval (of one workflow, or of all).

    With ``--json``, each line is one approval with its keys sorted, in the shape
    the API answers (:func:`durably.server.views.approval`): scripts read it
    rather than the text.
    """
    try:
        with _client(database) as client:
            pending = decisions.list_approvals(client, workflow_id)
    except errors.DurablyError as exc:
        _fail(exc)
    from durably.server import views  # late: `durably --help` does not load the server

    for p in pending:
        shown = views.approval(p)  # arguments nested too deep to show: a note, not a traceback
        if as_json:
            click.echo(json.dumps(shown, sort_keys=True, default=str))
        else:
            deadline = f"  (until {p.deadline})" if p.deadline else ""
            click.echo(f"{p.workflow_id}  {p.approval_id}  {shown['call']}{deadline}")
    if not pending and not as_json:
        click.echo("no pending approvals")


def _decide(action: str, database: str, workflow_id: str, **kw: Any) -> None:
    try:
        with _client(database) as client:
            if action == "approve":
                decided = decisions.approve(client, workflow_id, **kw)
            else:
                decided = decisions.reject(client, workflow_id, **kw)
    except (
        exceptions.ApprovalError,
        errors.DurablyError,
        ValueError,
    ) as exc:  # ValueError: no --by
        _fail(exc)
    done = {"approve": "approved", "reject": "rejected"}[action]
    override = kw.get("override_args")
    if override is not None:
        ran = dataclasses.replace(decided, arguments=dict(override))
        click.echo(
            f"{done} {ran.describe()} in {workflow_id} "
            f"(with changed arguments; the model requested {decided.describe()})"
        )
        return
    click.echo(f"{done} {decided.describe()} in {workflow_id}")


@click.command("approve")
@click.argument("workflow_id")
@click.option("--by", required=True, help="Who decides (journaled).")
@click.option("--call", "tool_call_id", default=None, help="The tool_call_id, if several wait.")
@click.option("--expect", default=None, help="The args_sha256 you were shown.")
@click.option("--args", "override", default=None, help="Run with these JSON arguments instead.")
@click.option("--note", default="", help="A note kept with the decision.")
@click.pass_obj
def approve_cmd(
    database: str,
    workflow_id: str,
    by: str,
    tool_call_id: str | None,
    expect: str | None,
    override: str | None,
    note: str,
) -> None:
    """Approve the pending tool call of WORKFLOW_ID."""
    try:
        override_args = json.loads(override) if override else None
    except json.JSONDecodeError as exc:
        _fail(ValueError(f"--args is not JSON: {exc}"))
    _decide(
        "approve",
        database,
        workflow_id,
        by=by,
        tool_call_id=tool_call_id,
        expect=expect,
        override_args=override_args,
        note=note,
    )


@click.command("reject")
@click.argument("workflow_id")
@click.option("--by", required=True, help="Who decides (journaled).")
@click.option("--reason", default="", help="Told to the model.")
@click.option("--call", "tool_call_id", default=None, help="The tool_call_id, if several wait.")
@click.option("--expect", default=None, help="The args_sha256 you were shown.")
@click.pass_obj
def reject_cmd(
    database: str,
    workflow_id: str,
    by: str,
    reason: str,
    tool_call_id: str | None,
    expect: str | None,
) -> None:
    """Reject the pending tool call of WORKFLOW_ID; the model reads the reason."""
    _decide(
        "reject",
        database,
        workflow_id,
        by=by,
        reason=reason,
        tool_call_id=tool_call_id,
        expect=expect,
    )


def _budget_refused(client: client_module.Client, workflow_id: str) -> str | None:
    """Why a decision would not be read now, if it would not: one sent while the run is
    not parked at its budget, or while an earlier decision waits to be read, would stay
    unread until the run next reaches its limit, and apply then, unasked."""
    info = client.get_workflow(workflow_id)
    if info.finished:
        return None  # the signal's own refusal says it (WorkflowFinished)
    waiting = any(
        e.kind == "signal" and e.name == budget.SIGNAL and e.status == "started"
        for e in client.history(workflow_id)
    )
    if not waiting:
        return (
            f"workflow {workflow_id!r} is not waiting at its model budget (it is "
            f"{info.status}): a raise or --stop is for a run parked at its limit; nothing "
            "was sent"
        )
    signals = client.signals(workflow_id)
    if any(s["name"] == budget.SIGNAL and s["consumed_seq"] is None for s in signals):
        return (
            f"a budget decision for {workflow_id!r} is already sent and not read yet (a "
            "worker reads it when it resumes the run); nothing was sent"
        )
    return None


@click.command("budget")
@click.argument("workflow_id")
@click.option("--by", required=True, help="Who decides (journaled).")
@click.option("--max-cost", type=float, default=None, help="New limit in dollars.")
@click.option("--max-tokens", type=int, default=None, help="New limit in tokens.")
@click.option("--stop", is_flag=True, help="End the run instead (BudgetExceeded).")
@click.pass_obj
def budget_cmd(
    database: str,
    workflow_id: str,
    by: str,
    max_cost: float | None,
    max_tokens: int | None,
    stop: bool,
) -> None:
    """Raise the model budget of WORKFLOW_ID, parked at its limit, or stop it."""
    try:
        with _client(database) as client:
            refused = _budget_refused(client, workflow_id)
            if refused is not None:
                _fail(ValueError(refused))
            budget.set_budget(
                client, workflow_id, by=by, max_cost=max_cost, max_tokens=max_tokens, stop=stop
            )
    except (ValueError, errors.DurablyError) as exc:  # any store error too: one line
        _fail(exc)
    if stop:
        click.echo(f"stopping {workflow_id} at its model budget")
        return
    limits = [
        f"max_cost=${max_cost}" if max_cost is not None else "",
        f"max_tokens={max_tokens:,}" if max_tokens is not None else "",
    ]
    click.echo(f"budget of {workflow_id} raised: {', '.join(x for x in limits if x)}")
