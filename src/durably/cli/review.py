"""The human review queue: ``durably review list`` and ``durably review resolve``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click
from rich.text import Text

from durably import receipts
from durably.cli.base import (
    _age,
    _client,
    _json_lines,
    _say,
    console,
    main,
)


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
        from durably.server import views  # late: `durably --help` does not load the server

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
        _say(f"                 --attempt {r.attempt} --result JSON | --retry | --fail REASON")


@review.command("resolve")
@click.argument("workflow_id")
@click.argument("seq", type=int)
@click.option("--result", "result_json", default=None, help="The step's result, as JSON.")
@click.option("--retry", is_flag=True, help="Run the step again with the same key.")
@click.option("--fail", "reason", default=None, help="Fail the step with this reason.")
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=None,
    help="The attempt of the review decided, as `review list` shows it; a decision for "
    "an earlier review at that seq is refused. Default: the review open there.",
)
@click.option("--by", default=lambda: os.environ.get("USER", "cli"), help="Who decides.")
@click.pass_obj
def review_resolve(
    database: str,
    workflow_id: str,
    seq: int,
    result_json: str | None,
    retry: bool,
    reason: str | None,
    attempt: int | None,
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
        decided = client.resolve(workflow_id, seq, by=by, attempt=attempt, **choice)
    _say(
        f"{workflow_id} seq {seq} ({decided.step}): {decided.decision} by {decided.decided_by}; "
        "the workflow resumes"
    )
