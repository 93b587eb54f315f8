"""A bench for the side-effect tests: a payments server, a database, child processes, the CLI.

Each :class:`Bench` owns one directory, one SQLite file, one workflow id and one
real :class:`~durably.testing.payments.FakePaymentsServer`. Workflows of
:mod:`tests.crashkit.refund_flows` run in child processes through
:func:`durably.testing.crashes.run_in_child` (optionally SIGKILLed by
``DURABLY_CRASH_AT``); what reached the payments service is read from its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import durably
from durably.testing import payments
from durably.testing.crashes import ChildRun, run_in_child
from tests import children
from tests.crashkit.refund_flows import PAYMENTS_ENV

REFUND_FLOW = "tests.crashkit.refund_flows:refund_flow"
CHECKOUT = "tests.crashkit.refund_flows:checkout"
CHECKOUT_AWAITING = "tests.crashkit.refund_flows:checkout_awaiting_confirmation"
WORKFLOW_ID = "refund-TCK-4417"


@dataclasses.dataclass
class Bench:
    """One scenario's files, database and payments service."""

    folder: Path
    server: payments.FakePaymentsServer
    workflow_id: str = WORKFLOW_ID

    @property
    def db(self) -> Path:
        return self.folder / "durably.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    @property
    def marker(self) -> Path:
        """Created by ``durably.faults`` just before the injected SIGKILL."""
        return self.folder / "crashed"

    def run(
        self,
        target: str,
        *args: Any,
        crash: str | None = None,
        until: tuple[str, ...] = ("needs_review",),
        child_timeout: float = 30.0,
        **kwargs: Any,
    ) -> ChildRun:
        """Start or recover the workflow in a new process; SIGKILL it at ``crash`` once."""
        env = {PAYMENTS_ENV: self.server.url}
        if crash is not None:
            env |= {"DURABLY_CRASH_AT": crash, "DURABLY_CRASH_ONCE": str(self.marker)}
        return run_in_child(
            target,
            args,
            kwargs,
            workflow_id=self.workflow_id,
            database_url=self.url,
            scenario_dir=self.folder,
            env=env,
            until=until,
            timeout=child_timeout,
        )

    # --- what the payments service saw ------------------------------------------------

    def posts(self) -> list[dict[str, Any]]:
        """Every ``POST /refunds`` the service received, in order."""
        return [r for r in payments.read_log(self.server.log_path) if r.get("method") == "POST"]

    def lookups(self) -> list[dict[str, Any]]:
        """Every ``GET /refunds?idempotency_key=`` the service received."""
        return [r for r in payments.read_log(self.server.log_path) if r.get("method") == "GET"]

    def refunds(self) -> list[dict[str, Any]]:
        """The distinct refunds the service created."""
        return payments.refunds_in_log(self.server.log_path)

    # --- what durably recorded -----------------------------------------------------------

    def workflow(self) -> durably.WorkflowInfo:
        with durably.Client(self.url) as client:
            return client.get_workflow(self.workflow_id)

    def steps(self) -> list[durably.Entry]:
        """The workflow's step entries, in seq order."""
        with durably.Client(self.url) as client:
            return [e for e in client.history(self.workflow_id) if e.kind == "step"]

    def step(self, name: str) -> durably.Entry:
        found = [e for e in self.steps() if e.name == name]
        assert len(found) == 1, [(e.seq, e.name) for e in self.steps()]
        return found[0]

    def key_of(self, name: str) -> str:
        """The idempotency key of the (only) call of step ``name``."""
        return f"{self.workflow_id}:{self.step(name).seq}"

    def reviews(self) -> list[durably.Review]:
        with durably.Client(self.url) as client:
            return client.reviews(self.workflow_id)

    def decided_reviews(self) -> list[dict[str, Any]]:
        """The decided rows of the ``reviews`` table (no public API lists them)."""
        import sqlite3

        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(
                "SELECT * FROM reviews WHERE workflow_id = ? AND decision IS NOT NULL",
                (self.workflow_id,),
            ).fetchall()
        return [dict(r) for r in rows]

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``python -m durably.cli --database URL ARGV`` in a new process."""
        env = children.child_env({"COLUMNS": "250"}, drop=("DURABLY_CRASH_AT",))
        return subprocess.run(
            children.durably_cli(self.url, *argv),
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )


@contextlib.contextmanager
def bench(folder: Path, flavour: payments.Flavour) -> Iterator[Bench]:
    """A bench in ``folder`` with a payments service of ``flavour`` running."""
    folder.mkdir(parents=True, exist_ok=True)
    with payments.FakePaymentsServer(folder / "payments.jsonl", flavour=flavour) as server:
        yield Bench(folder, server)


def payload(entry: durably.Entry) -> Any:
    """A journal entry's payload as plain JSON."""
    return json.loads(entry.payload or "null")
