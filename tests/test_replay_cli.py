"""``durably replay`` and ``durably.testing.replay``: today's code against recorded journals.

An agent with a refund tool runs against the fake model server and the fake
payments server and is exported; the code is then changed and the archive
replayed in a new process. Changed code fails with the readable error (seq and
source line); compatible code passes; neither replay makes a single request to
either server (their logs are counted).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import durably
from durably import cli
from durably.testing import FakeModelServer, FakePaymentsServer, by_turn, call, text, tool_calls
from durably.testing import models as fake_models
from durably.testing import payments as fake_payments
from tests import children

MODULE = "replay_ci_app"

APP = '''
import os

from openai import AsyncOpenAI

import durably
from durably.testing import payments

PAYMENTS = os.environ["REPLAY_PAYMENTS_URL"]


@durably.tool
def refund(order_id: str, cents: int) -> dict:
    """Refund an order."""
    made = payments.refund(PAYMENTS, order_id, cents, idempotency_key=durably.idempotency_key())
    return {"refund_id": made["refund_id"]}


@durably.step
def audit(ticket: str) -> str:
    return ticket


agent = durably.Agent(
    client=AsyncOpenAI(base_url=os.environ["REPLAY_MODEL_URL"], api_key="fake", max_retries=0),
    model="gpt-4.1-mini",
    instructions="You are a support agent.",
    tools=[refund],
)


@durably.workflow(name="replay-ci-support")
async def support(ticket: str) -> str:
{body}
'''

COMPATIBLE = """
    # reworded comment and a local rename: the same durable calls
    outcome = await agent.run(ticket)
    return str(outcome.output)
"""

CHANGED = """
    await audit(ticket)  # a new first step: journals recorded without it diverge here
    outcome = await agent.run(ticket)
    return str(outcome.output)
"""

ORIGINAL = """
    result = await agent.run(ticket)
    return str(result.output)
"""


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[FakeModelServer, FakePaymentsServer]]:
    script = by_turn([tool_calls(call("refund", {"order_id": "A1", "cents": 500})), text("Done.")])
    with (
        FakeModelServer(script, log_path=tmp_path / "model.jsonl") as model,
        FakePaymentsServer(tmp_path / "payments.jsonl") as pay,
    ):
        yield model, pay


def write_app(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "app" / f"{MODULE}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        textwrap.dedent(APP).replace(
            "{body}", textwrap.dedent(body).strip("\n").replace("\n", "\n    ").join(["    ", ""])
        )
    )
    return path


def app_env(tmp_path: Path, model: FakeModelServer, pay: FakePaymentsServer) -> dict[str, str]:
    return {"REPLAY_MODEL_URL": model.url, "REPLAY_PAYMENTS_URL": pay.url}


RECORD = """
import asyncio, sys
import durably
import replay_ci_app

async def main(url):
    async with durably.Engine(url) as engine:
        for wid in ("t-1", "t-2"):
            handle = await engine.start(replay_ci_app.support, "Refund A1", workflow_id=wid)
            print(await handle.result(timeout=60))

asyncio.run(main(sys.argv[1]))
"""


def run_py(tmp_path: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        children.python(*argv),
        cwd=tmp_path,
        env=children.child_env(env, paths=[tmp_path / "app", children.REPO, children.SRC]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def record(tmp_path: Path, url: str, env: dict[str, str]) -> Path:
    """Run the agent twice under the original code and export both workflows."""
    write_app(tmp_path, ORIGINAL)
    done = run_py(tmp_path, env, "-c", RECORD, url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["Done.", "Done."], done.stdout
    exported = run_py(tmp_path, env, "-m", "durably.cli", "--database", url, "export")
    assert exported.returncode == 0, exported.stderr
    archive = tmp_path / "archive.jsonl"
    archive.write_text(exported.stdout)
    return archive


def counts(model: FakeModelServer, pay: FakePaymentsServer) -> tuple[int, int]:
    assert model.log_path is not None
    return len(fake_models.read_log(model.log_path)), len(fake_payments.read_log(pay.log_path))


def test_replay_of_an_archive_fails_on_changed_code_and_passes_on_compatible_code(
    store_url: str, tmp_path: Path, servers: tuple[FakeModelServer, FakePaymentsServer]
) -> None:
    model, pay = servers
    env = app_env(tmp_path, model, pay)
    archive = record(tmp_path, store_url, env)
    recorded = counts(model, pay)
    assert recorded == (4, 2)  # two turns and one refund per workflow

    changed = write_app(tmp_path, CHANGED)
    line = next(
        i
        for i, t in enumerate(changed.read_text().splitlines(), 1)
        if "audit(" in t and "await" in t
    )
    done = run_py(tmp_path, env, "-m", "durably.cli", "replay", str(archive), "--app", MODULE)
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [ln for ln in done.stdout.splitlines() if ln.startswith("problem: ")]
    assert len(problems) == 2, done.stdout
    assert problems[0].startswith(
        "problem: t-1 (replay-ci-support) seq 1: workflow 't-1' "
        "diverged from its journal at seq 1: the journal recorded step "
    ), problems[0]
    assert f"the code asked for step 'audit' at {changed}:{line}" in problems[0], problems[0]
    assert "2 problem(s)" in done.stdout.splitlines()[-1], done.stdout

    write_app(tmp_path, COMPATIBLE)
    done = run_py(tmp_path, env, "-m", "durably.cli", "replay", str(archive), "--app", MODULE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"replayed 2 workflow(s) of {archive} against {MODULE}: 0 problem(s), 0 warning(s)"
    ], done.stdout

    # the live database gives the same answer, and the recorded database is untouched
    done = run_py(
        tmp_path, env, "-m", "durably.cli", "--database", store_url, "replay", "--app", MODULE,
        "--status", "completed",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert counts(model, pay) == recorded  # no model call, no payment: zero requests


def test_testing_replay_reports_problems_with_seq_and_line(
    sqlite_url: str, tmp_path: Path, servers: tuple[FakeModelServer, FakePaymentsServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    model, pay = servers
    env = app_env(tmp_path, model, pay)
    archive = record(tmp_path, sqlite_url, env)
    recorded = counts(model, pay)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path / "app"))
    changed = write_app(tmp_path, CHANGED)
    try:
        report = durably.testing.replay(archive, app=MODULE)
        assert not report.ok
        assert [(p.workflow_id, p.seq) for p in report.problems] == [("t-1", 1), ("t-2", 1)]
        assert report.problems[0].site is not None
        assert report.problems[0].site.startswith(f"{changed}:")
        assert "the code asked for step 'audit'" in report.problems[0].message
    finally:
        sys.modules.pop(MODULE, None)
    assert counts(model, pay) == recorded


def test_replay_refuses_a_corrupt_archive_naming_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"durably_archive": 1}\n{"workflow": \n')
    result = CliRunner().invoke(cli.main, ["replay", str(bad), "--app", "json"])
    assert result.exit_code == 1
    assert f"{bad} line 2" in result.output, result.output


def test_a_workflow_no_module_defines_is_a_problem(sqlite_url: str) -> None:
    @durably.workflow(name="replay-known")
    async def known() -> int:
        return 1

    async def main() -> None:
        async with durably.Engine(sqlite_url) as engine:
            await (await engine.start(known, workflow_id="k")).result(timeout=20)

    asyncio.run(main())
    with durably.Client(sqlite_url) as client:  # committed for a worker with other code
        client.start("replay-unknown-name", workflow_id="u")
    report = durably.testing.replay(database=sqlite_url, ids=["k", "u"])
    assert report.replayed == ("k", "u")
    [problem] = report.problems
    assert (problem.workflow_id, problem.seq) == ("u", None)
    assert "no workflow named 'replay-unknown-name' is defined by the imported code" in (
        problem.message
    )


def test_replay_of_a_missing_archive_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    result = CliRunner().invoke(cli.main, ["replay", str(missing), "--app", "json"])
    assert result.exit_code != 0
    assert "nope.jsonl" in result.output and "No such file" in result.output, result.output


ORDER_APP = """
import dataclasses

import durably


@dataclasses.dataclass
class {cls}:
    order_id: str
{extra}

@durably.step
def load(order_id: str) -> {cls}:
    return {cls}(order_id{extra_arg})


@durably.workflow(name="replay-ci-orders")
async def orders(order_id: str) -> str:
    order = await load(order_id)
    await durably.wait_for_signal("approve")
    return order.order_id
"""


def write_orders(tmp_path: Path, cls: str, extra: str = "", extra_arg: str = "") -> Path:
    path = tmp_path / "app" / "replay_ci_orders.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(ORDER_APP.format(cls=cls, extra=extra, extra_arg=extra_arg))
    return path


RECORD_ORDERS = """
import asyncio, sys
import durably
import replay_ci_orders

async def main(url):
    async with durably.Engine(url, hold_seconds=0) as engine:
        handle = await engine.start(replay_ci_orders.orders, "A1", workflow_id="o-1")
        while await handle.status() != "waiting":
            await asyncio.sleep(0.02)

asyncio.run(main(sys.argv[1]))
"""


def test_replay_reports_a_recorded_value_that_no_longer_decodes(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A parked workflow's step returned an ``Order``; the class is renamed and gains a
    required field: today's code cannot decode the receipt. Replay says so, with the seq."""
    write_orders(tmp_path, "Order")
    done = run_py(tmp_path, {}, "-c", RECORD_ORDERS, sqlite_url)
    assert done.returncode == 0, done.stderr[-3000:]

    write_orders(tmp_path, "Purchase", extra="    total: int\n", extra_arg=", 0")
    done = run_py(
        tmp_path, {}, "-m", "durably.cli", "--database", sqlite_url, "replay",
        "--app", "replay_ci_orders", "--status", "waiting",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    [problem] = [ln for ln in done.stdout.splitlines() if ln.startswith("problem: ")]
    assert problem.startswith("problem: o-1 (replay-ci-orders) seq 1 at "), problem
    assert "replay_ci_orders.py:" in problem, problem
    assert "decode" in problem.lower() and "Order" in problem, problem

    write_orders(tmp_path, "Order")  # the compatible code again
    done = run_py(
        tmp_path, {}, "-m", "durably.cli", "--database", sqlite_url, "replay",
        "--app", "replay_ci_orders",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
