"""Replay checks a person can act on: readable divergences and changed step arguments.

A deploy is played out in one process: the workflow's module is written to a
file, a workflow parks on a signal under that code, the engine closes, the file
is rewritten and reloaded (a new source hash), and a new engine recovers the
workflow. Both backends.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

import durably
import durably.testing
from durably import cli

APP = """
import durably

CALLS = []


@durably.step
def charge(order: str, cents: int) -> int:
    CALLS.append(("charge", order, cents))
    return cents


@durably.step
def refund(order: str, cents: int) -> int:
    CALLS.append(("refund", order, cents))
    return -cents


@durably.workflow(name="deploy-app")
async def billing(order: str) -> int:
    paid = await {first}
    await durably.wait_for_signal("go")
    return paid
"""


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    name = "replay_deploy_app"  # one name: each test's code replaces the last one's
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path / f"{name}.py", name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def deploy(app: tuple[Path, str], first: str) -> ModuleType:
    """Write the app with ``first`` as its first step call, and (re)load it."""
    path, name = app
    path.write_text(textwrap.dedent(APP.format(first=first)))
    importlib.invalidate_caches()
    if name in sys.modules:
        return importlib.reload(sys.modules[name])
    return importlib.import_module(name)


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


async def park(url: str, module: ModuleType, wid: str) -> None:
    """Start the workflow under today's code and let it park on its signal."""
    async with durably.Engine(url, hold_seconds=0) as engine:
        handle = await engine.start(module.billing, "o-1", workflow_id=wid)
        for _ in range(500):
            if await handle.status() == "waiting":
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{wid} never parked: {await handle.status()}")


async def signal_and_wait(url: str, wid: str, **engine_kw: Any) -> tuple[Any, durably.WorkflowInfo]:
    """Recover the workflow under today's code, let it go on, return (result or error, info)."""
    async with durably.Engine(url, **engine_kw) as engine:
        await engine.send_signal(wid, "go", True)
        handle = engine.handle(wid)
        try:
            outcome: Any = await handle.result(timeout=30)
        except Exception as exc:
            outcome = exc
        return outcome, await handle.info()


def test_a_divergence_names_seq_both_calls_the_new_line_and_both_codes(
    store_url: str, app: tuple[Path, str]
) -> None:
    old = deploy(app, "charge(order, 100)")
    asyncio.run(park(store_url, old, "wf-div"))
    old_hash = old.billing.definition.source_hash
    new = deploy(app, "refund(order, 100)")
    new_hash = new.billing.definition.source_hash
    assert old_hash != new_hash

    outcome, info = asyncio.run(signal_and_wait(store_url, "wf-div"))

    assert isinstance(outcome, durably.NonDeterminismError), outcome
    assert info.status == "diverged"
    line = line_of(app[0], "refund(order, 100)")
    assert str(outcome) == (
        f"workflow 'wf-div' diverged from its journal at seq 1: the journal recorded "
        f"step 'charge' (under source {old_hash}), the code asked for step 'refund' "
        f"at {app[0]}:{line} (under source {new_hash})"
    )
    assert outcome.site == f"{app[0]}:{line}"
    assert new.CALLS == []  # nothing ran under the new code


def test_changed_step_arguments_are_a_warning_on_the_workflow_by_default(
    store_url: str, app: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    old = deploy(app, "charge(order, 100)")
    asyncio.run(park(store_url, old, "wf-warn"))
    new = deploy(app, "charge(order, 250)")

    with caplog.at_level(logging.WARNING, logger="durably"):
        outcome, info = asyncio.run(signal_and_wait(store_url, "wf-warn"))

    assert outcome == 100  # the recorded result stands: the step did not run again
    assert new.CALLS == []
    assert info.status == "completed"
    line = line_of(app[0], "charge(order, 250)")
    warnings = (info.warnings or "").splitlines()
    assert len(warnings) == 1, warnings
    assert "seq 1: step 'charge'" in warnings[0], warnings
    assert f"at {app[0]}:{line}" in warnings[0], warnings
    assert "other arguments" in warnings[0], warnings
    logged = [r.getMessage() for r in caplog.records if "other arguments" in r.getMessage()]
    assert logged == [warnings[0]], logged
    # `durably show` prints it
    shown = CliRunner().invoke(
        cli.main, ["-d", store_url, "show", "wf-warn"], env={"COLUMNS": "400"}
    )
    assert shown.exit_code == 0, shown.output
    assert f"warning: {warnings[0]}\n" in shown.output, shown.output


def test_changed_step_arguments_diverge_under_strict_replay(
    store_url: str, app: tuple[Path, str]
) -> None:
    old = deploy(app, "charge(order, 100)")
    asyncio.run(park(store_url, old, "wf-strict"))
    new = deploy(app, "charge(order, 250)")

    outcome, info = asyncio.run(signal_and_wait(store_url, "wf-strict", strict_replay=True))

    assert isinstance(outcome, durably.ArgumentsChanged), outcome
    assert isinstance(outcome, durably.NonDeterminismError)
    assert info.status == "diverged"
    assert info.warnings is None
    line = line_of(app[0], "charge(order, 250)")
    message = str(outcome)
    assert message.startswith(
        f"workflow 'wf-strict' seq 1: step 'charge' at {app[0]}:{line} was called with "
        "other arguments than the journal recorded"
    ), message
    assert new.CALLS == []


def test_the_same_arguments_replay_without_a_warning(store_url: str, app: tuple[Path, str]) -> None:
    old = deploy(app, "charge(order, cents=100)")
    asyncio.run(park(store_url, old, "wf-same"))
    deploy(app, "charge(order, cents=100)  # reformatted, same call")

    outcome, info = asyncio.run(signal_and_wait(store_url, "wf-same", strict_replay=True))

    assert outcome == 100
    assert info.warnings is None


def test_digests_and_warnings_travel_in_archives_and_older_archives_still_import(
    store_url: str, app: tuple[Path, str], tmp_path: Path
) -> None:
    """Exported and imported (SQLite and PostgreSQL to SQLite), a journal keeps its digests,
    so the import is checked on replay too; an archive from before schema 8 imports."""
    import json

    old = deploy(app, "charge(order, 100)")
    asyncio.run(park(store_url, old, "wf-arch"))
    deploy(app, "charge(order, 250)")
    exported = CliRunner().invoke(cli.main, ["--database", store_url, "export"])
    assert exported.exit_code == 0, exported.output
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    [record] = [line for line in lines if "workflow" in line]
    digests = [row["args_digest"] for row in record["journal"] if row["kind"] == "step"]
    assert len(digests) == 1 and digests[0], record["journal"]
    (tmp_path / "new.jsonl").write_text(exported.stdout)
    del record["workflow"]["warnings"]
    for row in record["journal"]:  # as written by a durably from before the digests
        del row["args_digest"]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    for name, warned in (("new", True), ("old", False)):
        target = f"sqlite:///{tmp_path / name}.db"
        imported = CliRunner().invoke(
            cli.main, ["--database", target, "import", str(tmp_path / f"{name}.jsonl")]
        )
        assert imported.exit_code == 0, imported.output
        outcome, info = asyncio.run(signal_and_wait(target, "wf-arch"))
        assert outcome == 100
        assert bool(info.warnings) is warned, info.warnings


def test_the_digest_of_arguments_is_pinned() -> None:
    """The digest is part of the journal: recorded journals are compared against it, so its
    formula never changes silently (a change would flag every replayed step)."""
    from durably import step_keys

    assert step_keys.args_digest(("order-17", 1250), {}) == "aed22c61b30b3f22"
    with_keywords = step_keys.args_digest(("order-17",), {"cents": 1250, "a": [1.5, None]})
    assert with_keywords == "283e9293c5d41404"
    assert step_keys.args_digest(("order-17",), {"a": [1.5, None], "cents": 1250}) == (
        with_keywords
    )  # keywords compare by name, whatever their order
    assert step_keys.args_digest((object(),), {}) is None  # not encodable: not checked


def test_replay_in_ci_warns_of_changed_arguments_and_fails_on_them_when_strict(
    store_url: str, app: tuple[Path, str]
) -> None:
    old = deploy(app, "charge(order, 100)")
    asyncio.run(park(store_url, old, "wf-ci"))
    new = deploy(app, "charge(order, 250)")
    line = line_of(app[0], "charge(order, 250)")

    report = durably.testing.replay(database=store_url)
    assert report.ok and report.replayed == ("wf-ci",), report
    [warning] = report.warnings
    assert (warning.seq, warning.site) == (1, f"{app[0]}:{line}")
    assert "other arguments" in warning.message

    strict = durably.testing.replay(database=store_url, strict_replay=True)
    assert not strict.ok
    [problem] = strict.problems
    assert (problem.workflow_id, problem.seq, problem.site) == ("wf-ci", 1, f"{app[0]}:{line}")
    assert new.CALLS == []  # no step ran
    with durably.Client(store_url) as client:  # and nothing was written
        info = client.get_workflow("wf-ci")
    assert (info.status, info.warnings) == ("waiting", None)
