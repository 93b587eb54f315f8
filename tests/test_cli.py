"""The command line as a newcomer meets it: markup-like user text, mistyped paths,
wrong arguments, 80 columns, commands that run in place, and work nobody runs.

Every command runs through click's CliRunner against a real database file (or
PostgreSQL where a test says so); nothing of durably is mocked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import durably
from durably import cli, errors, journal, operations
from durably.agents import budget
from durably.cli import workflows as cli_workflows
from durably.storage import base, create_store
from durably.testing import crashes
from tests import children

#: Rich markup, an unclosed tag and an escaped bracket: what broke `list` and `show`.
MARK = "[/][bold]x[red]y[/] \\[z]"


@durably.workflow(name=f"cli_echo{MARK}")
async def echo(text: str) -> str:
    return f"done {text}"


@durably.workflow(name="cli_two_args")
async def two_args(a: int, b: int) -> int:
    return a + b


@durably.workflow(name="cli_fails")
async def fails(text: str) -> str:
    raise ValueError(f"broken {text}")


@durably.workflow(name="cli_sleeper")
async def sleeper(naps: int) -> int:
    for _ in range(naps):
        await durably.sleep(0.01)
    return naps


@durably.workflow(name="cli_bad_parent")
async def bad_parent() -> str:
    try:
        await durably.start_child(two_args, 1, 2, 3)
    except errors.WorkflowArgumentsError as exc:
        return f"refused: {exc}"
    return "started"


@durably.workflow(name="cli_once_broken")
async def once_broken(flag: str) -> str:
    """Fails while the file ``flag`` exists; a resume after removing it completes."""
    await durably.run_step(_check_flag, flag)
    return "fixed"


def _check_flag(flag: str) -> str:
    if os.path.exists(flag):
        raise RuntimeError("the flag is still there")
    return "ok"


def invoke(url: str, *args: str, columns: int = 200) -> Result:
    """Run ``durably -d URL ARGS`` in this process; the result keeps the output."""
    return CliRunner().invoke(cli.main, ["-d", url, *args], env={"COLUMNS": str(columns)})


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def async_wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def commit(url: str, new: base.NewWorkflow, owner: str | None = None) -> None:
    """Commit a workflow row as given (another application's start, say) through a store."""
    store = create_store(url)
    store.open()
    try:
        op = base.Op(store.create_workflow, (new, owner, None, time.time()), write=True)
        store.run_batch([op])
        assert op.error is None, op.error
    finally:
        store.close()


def run_verb(url: str, fn_name: str, *args: Any) -> Any:
    store = create_store(url)
    store.open()
    try:
        op = base.Op(getattr(store, fn_name), args, write=True)
        store.run_batch([op])
        if op.error is not None:
            raise op.error
        return op.result
    finally:
        store.close()


# --- 1. markup-like user text in every command --------------------------------------------


def test_markup_like_text_goes_through_every_command(sqlite_url: str, tmp_path: Path) -> None:
    """Ids, names, results, errors, steps, keys and executor ids holding rich markup are
    printed as they are by every command (before: MarkupError, for the whole database)."""
    done, failed, pending, parked = (f"{kind}{MARK}" for kind in ("done", "failed", "p", "r"))
    assert durably.run(echo, MARK, workflow_id=done, database=sqlite_url) == f"done {MARK}"
    with pytest.raises(ValueError):
        durably.run(fails, MARK, workflow_id=failed, database=sqlite_url)
    with durably.Client(sqlite_url) as client:
        client.start(echo, MARK, workflow_id=pending)  # pending: `show` crashed on it
    new, _ = operations.new_workflow(echo, (MARK,), {}, parked)
    commit(sqlite_url, new, owner=f"ex{MARK}")
    intent = journal.Entry(1, "step", f"refund{MARK}", "started", 1, json.dumps([MARK]))
    run_verb(
        sqlite_url, "open_review", parked, 1, intent, f"key{MARK}", f"why{MARK}", [intent], 1.0
    )
    me = journal.ExecutorInfo(f"ex{MARK}", "host", 1, "t", time.time(), time.time())
    run_verb(sqlite_url, "register_executor", dataclasses.replace(me, queues=(f"q{MARK}",)))

    listed = invoke(sqlite_url, "list")
    assert listed.exit_code == 0, listed.output
    for wid in (done, failed, pending, parked):
        assert wid in listed.output
    assert f"cli_echo{MARK}" in listed.output
    for wid, expected in (
        (done, f"done {MARK}"),
        (failed, f"broken {MARK}"),
        (pending, pending),
        (parked, f"refund{MARK}"),
    ):
        shown = invoke(sqlite_url, "show", wid)
        assert shown.exit_code == 0, shown.output
        assert wid in shown.output and expected.replace('"', "") in shown.output.replace(
            "\\\\", "\\"
        ), shown.output
    reviews = invoke(sqlite_url, "review", "list")
    assert reviews.exit_code == 0, reviews.output
    for text in (parked, f"refund{MARK}", f"key{MARK}", f"why{MARK}"):
        assert text in reviews.output
    workers = invoke(sqlite_url, "workers")
    assert (
        workers.exit_code == 0 and f"ex{MARK}" in workers.output and f"q{MARK}" in (workers.output)
    ), workers.output
    for args, expected in (
        (["signal", pending, f"go{MARK}"], f"{'go' + MARK!r} sent to {pending}"),
        (["cancel", pending], pending),
        (["fork", done, "--from-seq", "0", "--id", f"f{MARK}", "--no-wait"], f"f{MARK}"),
        (["resume", failed, "--no-wait"], f"{failed} is pending again"),
        (["approvals"], "no pending approvals"),
        (["show", f"missing{MARK}"], f"no workflow with id {'missing' + MARK!r}"),
        (["review", "resolve", parked, "1", "--fail", f"no{MARK}"], f"workflow {parked!r}"),
    ):
        result = invoke(sqlite_url, *args)
        assert expected in result.output, (args, result.output)
        assert "MarkupError" not in repr(result.exception), (args, result.exception)


def test_the_demo_prints_a_workdir_with_markup_like_text(tmp_path: Path) -> None:
    workdir = tmp_path / f"demo{MARK}"
    args = ["demo", "--scripted", "--workdir", str(workdir)]
    result = CliRunner().invoke(cli.main, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"database: {workdir}" in result.output  # the path as it is, not read as markup
    assert "one refund, as promised." in result.output


def test_the_crash_report_prints_markup_like_text_as_it_is(tmp_path: Path) -> None:
    report = _report(step=f"refund{MARK}", status=f"odd{MARK}", error=f"boom{MARK}")
    for width in (80, 400):  # the blocks of a narrow terminal, the table of a wide one
        text = report.table(width=width)
        assert f"after_call:refund{MARK}@1" in text
        assert f"odd{MARK}" in text and "boom[/][bold]x[red]" in text  # cut when wide
        assert f"violation at after_call:refund{MARK}@1: it broke{MARK}" in " ".join(text.split())


def _report(step: str, status: str = "completed", error: str | None = None) -> Any:
    def scenario(boundary: crashes.Boundary | None, problems: tuple[str, ...]) -> Any:
        return crashes.Scenario(
            boundary=boundary,
            workflow_id="wf-" + "0123456789abcdef" * 2,
            directory=Path("."),
            exit_codes=(-9, 0),
            died=True,
            status=status,
            result={"refund": "re_123", "amount": "120.00"},
            error=error,
            keys=(crashes.KeyCount(f"{step}:key-1", step, 2, "plain", 2, 1, 1, 1, 1, 1),),
            verdict="violation" if problems else "ok",
            problems=problems,
        )

    boundaries = [crashes.Boundary(point, step, 1) for point in ("before_call", "after_call")]
    return crashes.CrashReport(
        target="tests.some_module:some_workflow",
        workdir=Path("."),
        baseline=scenario(None, ()),
        scenarios=(scenario(boundaries[0], ()), scenario(boundaries[1], (f"it broke{MARK}",))),
        has_effects=True,
    )


# --- 2. a command that reads never creates a database ------------------------------------


READERS = [
    ["list"],
    ["show", "wf-1"],
    ["workers"],
    ["review", "list"],
    ["approvals"],
    ["signal", "wf-1", "go"],
    ["cancel", "wf-1"],
    ["resume", "wf-1", "--no-wait"],
    ["fork", "wf-1", "--from-seq", "1", "--no-wait"],
    ["review", "resolve", "wf-1", "1", "--retry"],
    ["approve", "wf-1", "--by", "me"],
    ["budget", "wf-1", "--by", "me", "--max-cost", "1"],
]


@pytest.mark.parametrize("args", READERS, ids=lambda a: "-".join(a[:2]))
def test_a_mistyped_sqlite_path_is_an_error_not_a_new_database(
    tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "apps.db"  # the user meant tmp_path / "app.db"
    result = invoke(f"sqlite:///{path}", *args)
    assert result.exit_code != 0, result.output
    assert f"no SQLite database at {str(path)!r}" in result.output, result.output
    assert "Traceback" not in result.output
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # no -wal, no -shm either


@pytest.mark.parametrize("command", [["list"], ["migrate"]])
def test_a_path_given_for_a_url_is_refused_with_the_url_it_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """`-d app.db` is what a newcomer types (before: "unsupported database URL scheme
    'app.db'", which has no scheme)."""
    monkeypatch.chdir(tmp_path)
    for typed, meant in (("app.db", "sqlite:///app.db"), (f"{tmp_path}/a.db", "sqlite:////")):
        result = invoke(typed, *command)
        assert result.exit_code == 1, result.output
        assert f"error: {typed!r} is not a database URL" in result.output, result.output
        assert meant in result.output, result.output
    assert not list(tmp_path.iterdir())


def test_a_reader_refuses_a_database_without_durably_schema(empty_store_url: str) -> None:
    """Both backends: an empty database (a wrong PostgreSQL db name, an empty file) is
    reported, and nothing is created in it."""
    if empty_store_url.startswith("sqlite"):
        Path(empty_store_url.removeprefix("sqlite:///")).touch()
    with (
        pytest.raises(errors.DatabaseNotFound, match="holds no durably database"),
        durably.Client(empty_store_url, create=False) as client,
    ):
        client.list_workflows()
    store = create_store(empty_store_url)
    store.create = False
    with pytest.raises(errors.DatabaseNotFound):
        store.open()
    with durably.Client(empty_store_url) as client:  # a writer still creates it
        assert client.list_workflows() == []
    with durably.Client(empty_store_url, create=False) as client:  # then it exists
        assert client.list_workflows() == []


def test_a_reader_of_an_existing_database_works(sqlite_url: str) -> None:
    durably.run(two_args, 1, 2, workflow_id="w", database=sqlite_url)
    result = invoke(sqlite_url, "list")
    assert result.exit_code == 0 and "w " in result.output and "completed" in result.output


BAD_VALUES = [
    (["list", "--limit", "0"], "--limit"),
    (["list", "--limit", "-1"], "--limit"),
    (["list", "--offset", "-1"], "--offset"),
    (["fork", "wf-1", "--from-seq", "-1", "--no-wait"], "--from-seq"),
    (["worker", "tests.test_cli", "--lease", "0"], "--lease"),
    (["worker", "tests.test_cli", "--poll", "-1"], "--poll"),
    (["worker", "tests.test_cli", "--max-recoveries", "-1"], "--max-recoveries"),
    (["serve", "--port", "70000"], "--port"),
    (["test-crashes", "tests.test_cli:echo", "--timeout", "0"], "--timeout"),
]


@pytest.mark.parametrize(("args", "option"), BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_an_option_out_of_range_is_a_usage_error_naming_it(
    sqlite_url: str, args: list[str], option: str
) -> None:
    """Refused by the option before anything runs (before: the engine's ValueError, or
    bind()'s OverflowError, as a traceback; a crash test ran with a timeout of 0)."""
    durably.run(two_args, 1, 2, workflow_id="wf-1", database=sqlite_url)
    result = invoke(sqlite_url, *args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"Invalid value for '{option}'" in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["approve", "wf-1", "--by", "me", "--args", "{bad"], "--args is not JSON"),
        (["approve", "wf-1", "--by", ""], "a decision needs by="),
        (["reject", "wf-1", "--by", ""], "a decision needs by="),
    ],
    ids=["args-not-json", "approve-by-nobody", "reject-by-nobody"],
)
def test_a_bad_decision_is_one_line_not_a_traceback(
    sqlite_url: str, args: list[str], said: str
) -> None:
    durably.run(two_args, 1, 2, workflow_id="wf-1", database=sqlite_url)
    result = invoke(sqlite_url, *args)
    assert result.exit_code == 1, (result.output, result.exception)
    assert said in result.output and len(result.output.splitlines()) == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception


@durably.workflow(name="cli_budget_parked")
async def budget_parked() -> Any:
    """Parks as a run at its model budget does: waiting for the budget signal."""
    return await durably.wait_for_signal(budget.SIGNAL)


def test_budget_is_refused_unless_the_run_waits_for_a_decision(sqlite_url: str) -> None:
    """A decision sent to a run not parked at its budget (or parked with one already sent)
    is not read now: it waits for the run's next time at its limit and applies then,
    unasked (before: `budget of ... raised`, exit 0, the signal committed)."""

    async def park() -> None:
        async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
            handle = await engine.start(budget_parked, workflow_id="parked")
            for _ in range(1000):
                if (status := await handle.status()) not in ("pending", "running"):
                    break
                await asyncio.sleep(0.02)
            assert status == "waiting", status

    asyncio.run(park())
    with durably.Client(sqlite_url) as client:
        client.start(two_args, 1, 2, workflow_id="not-parked")
    result = invoke(sqlite_url, "budget", "not-parked", "--by", "me", "--max-cost", "5")
    assert result.exit_code == 1, result.output
    assert result.output.startswith(
        "error: workflow 'not-parked' is not waiting at its model budget (it is pending)"
    ), result.output
    result = invoke(sqlite_url, "budget", "parked", "--by", "me", "--max-cost", "5")
    assert result.exit_code == 0 and "budget of parked raised" in result.output, result.output
    result = invoke(sqlite_url, "budget", "parked", "--by", "me", "--stop")
    assert result.exit_code == 1, result.output
    assert "a budget decision for 'parked' is already sent" in result.output, result.output
    with durably.Client(sqlite_url) as client:
        assert client.signals("not-parked") == []
        [sent] = client.signals("parked")
        assert json.loads(sent["payload"])["max_cost"] == 5


@durably.workflow(name="cli_long_nap")
async def long_nap() -> None:
    await durably.sleep(3600)


@durably.workflow(name="cli_waits_for")
async def waits_for(signal_name: str) -> Any:
    return await durably.wait_for_signal(signal_name)


def test_show_says_what_a_parked_workflow_waits_for_and_the_command_that_moves_it(
    sqlite_url: str,
) -> None:
    """A newcomer reads `sleep() (started)` or `signal() approval:... (started)` and does
    not know when it wakes or which command moves it (before: nothing said either)."""

    async def park() -> None:
        async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
            handles = [
                await engine.start(long_nap, workflow_id="nap"),
                await engine.start(waits_for, "go", workflow_id="signal"),
                await engine.start(waits_for, "approval:refund-1", workflow_id="approval"),
                await engine.start(budget_parked, workflow_id="budget"),
            ]
            for handle in handles:
                for _ in range(1000):
                    if await handle.status() not in ("pending", "running"):
                        break
                    await asyncio.sleep(0.02)

    asyncio.run(park())
    new, _ = operations.new_workflow(two_args, (1, 2), {}, "review")
    commit(sqlite_url, new, owner="ex-a")
    intent = journal.Entry(1, "step", "transfer", "started", 1, '{"args": [1]}')
    run_verb(sqlite_url, "open_review", "review", 1, intent, "k", "why", [intent], 1.0)
    with durably.Client(sqlite_url) as client:
        wake_at = client.get_workflow("nap").wake_at
    assert wake_at is not None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wake_at))
    for wid, said in (
        ("nap", f"sleeping  started {time.strftime('%Y-%m-%d')}"),
        ("signal", "waits for signal 'go': durably signal signal go PAYLOAD_JSON"),
        ("approval", "waits for an approval: durably approvals approval"),
        ("budget", "waits for its model budget: durably budget budget --by NAME --max-cost"),
        ("review", "waits for a decision on transfer (seq 1): durably review list --id review"),
    ):
        result = invoke(sqlite_url, "show", wid)
        assert result.exit_code == 0, result.output
        assert said in result.output, (wid, result.output)
    assert f"wakes {when}" in _lines(invoke(sqlite_url, "show", "nap"))[0]
    done = invoke(sqlite_url, "show", "signal")
    assert "wakes" not in done.output, done.output  # a wait without a timeout has no time
    assert invoke(sqlite_url, "signal", "signal", "go").exit_code == 0
    sent = invoke(sqlite_url, "show", "signal")  # a worker reads it: it is due now
    assert "due since" in _lines(sent)[0] and "waits for" not in sent.output, sent.output


def test_budget_on_a_locked_database_is_one_line(sqlite_url: str) -> None:
    """Every store error is the one line of the others (before: DatabaseLocked and
    DatabaseNotFound ended `durably budget` in a traceback)."""
    durably.run(sleeper, 0, workflow_id="wf-1", database=sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    script = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(60)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            locked = f"{sqlite_url}?busy_timeout=100"
            result = invoke(locked, "budget", "wf-1", "--by", "me", "--max-cost", "1")
        finally:
            holder.kill()
    assert result.exit_code == 1, (result.output, result.exception)
    assert "error: " in result.output and "stayed locked" in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception


@pytest.mark.parametrize(
    "args",
    [
        ["show", "order-"],
        ["signal", "order-", "go"],
        ["cancel", "order-"],
        ["resume", "order-", "--no-wait"],
        ["fork", "order-", "--from-seq", "0", "--no-wait"],
        ["review", "resolve", "order-", "1", "--retry"],
        ["approve", "order-", "--by", "me"],
        ["budget", "order-", "--by", "me", "--stop"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_an_id_that_only_begins_real_ones_names_them(sqlite_url: str, args: list[str]) -> None:
    """An id typed short is refused (never taken for the one it begins: cancel and fork
    act on what they are given) and the error names the ids it begins."""
    with durably.Client(sqlite_url) as client:
        for wid in ("order-17", "order-18", "other"):
            client.start(two_args, 1, 2, workflow_id=wid)
    result = invoke(sqlite_url, *args)
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"error: no workflow with id 'order-' in {sqlite_url}; "
        "ids that begin with it: order-17, order-18\n"
    ), result.output
    result = invoke(sqlite_url, *[a.replace("order-", "zzz") for a in args])
    assert result.output == f"error: no workflow with id 'zzz' in {sqlite_url}\n", result.output
    with durably.Client(sqlite_url) as client:
        assert {w.status for w in client.list_workflows()} == {"pending"}
        assert client.signals("order-17") == [] and len(client.list_workflows()) == 3


# --- 3. arguments are checked against the signature before anything is committed --------


def test_wrong_arguments_commit_nothing(store_url: str) -> None:
    async def main() -> None:
        q = durably.Queue("cli_args_q")
        async with durably.Engine(store_url, poll_interval=0.05) as engine:
            for attempt in (
                lambda: engine.start(two_args, 1, 2, 3),
                lambda: engine.start(two_args, 1),
                lambda: engine.start(two_args, 1, c=2),
                lambda: q.enqueue(engine, two_args, 1),
            ):
                with pytest.raises(errors.WorkflowArgumentsError, match="cli_two_args"):
                    await attempt()
            assert await engine.list_workflows() == []

    asyncio.run(main())
    with durably.Client(store_url) as client:
        with pytest.raises(TypeError, match=r"takes two_args\(a, b\)"):
            client.start(two_args, 1, 2, 3)
        assert client.list_workflows() == []


def test_a_child_with_wrong_arguments_is_refused_at_the_call(sqlite_url: str) -> None:
    result = durably.run(bad_parent, workflow_id="parent", database=sqlite_url)
    assert result.startswith("refused: workflow 'cli_two_args' takes two_args(a, b)")
    with durably.Client(sqlite_url) as client:
        assert [w.workflow_id for w in client.list_workflows()] == ["parent"]


def test_start_with_wrong_arguments_prints_the_error_without_a_traceback(
    sqlite_url: str,
) -> None:
    for extra in ([], ["--no-wait"]):
        result = invoke(sqlite_url, "start", "tests.test_cli:two_args", "[1, 2, 3]", *extra)
        assert result.exit_code == 1, result.output
        assert (
            "error: workflow 'cli_two_args' takes two_args(a, b); cannot call it with 3"
            in result.output
        )
        assert "Traceback" not in result.output and result.exception is not None
        assert isinstance(result.exception, SystemExit)
    with durably.Client(sqlite_url) as client:
        assert client.list_workflows() == []


# --- 4. tables at 80 columns --------------------------------------------------------------


def _lines(result: Result) -> list[str]:
    return result.output.splitlines()


def test_tables_fit_80_columns_with_ids_and_keys_whole(sqlite_url: str) -> None:
    wids = [f"{i}-{'0123456789abcdef' * 2}" for i in range(3)]
    for wid in wids[:2]:
        durably.run(two_args, 1, 2, workflow_id=wid, database=sqlite_url)
    new, _ = operations.new_workflow(two_args, (1, 2), {}, wids[2])
    commit(sqlite_url, new, owner="ex-a")
    key = f"durably:{wids[2]}:1:1"
    intent = journal.Entry(1, "step", "issue_refund_to_customer", "started", 1, '{"args": [1]}')
    run_verb(
        sqlite_url,
        "open_review",
        wids[2],
        1,
        intent,
        key,
        "at_most_once: the call may have happened",
        [intent],
        1.0,
    )
    for args, whole in (
        (["list"], wids),
        (["review", "list"], [wids[2], key, f"durably review resolve {wids[2]} 1"]),
    ):
        result = invoke(sqlite_url, *args, columns=80)
        assert result.exit_code == 0, result.output
        assert all(len(line) <= 80 for line in _lines(result)), result.output
        for text in whole:
            assert any(text in line for line in _lines(result)), (text, result.output)
    listed = _lines(invoke(sqlite_url, "list", columns=80))
    assert len(listed) >= 1 + len(wids) + 1, listed  # a line per workflow, and the note:
    note = " ".join(" ".join(listed[1 + len(wids) :]).split())
    assert note == f"! {wids[2]}: no running worker has workflow 'cli_two_args'", listed
    for wid in wids:  # no date or status wraps to a line of its own
        assert any(wid in line and ":" in line.split(wid)[1] for line in listed), listed


@durably.workflow(name="cli_a_workflow_with_a_rather_long_name_for_a_table_of_80")
async def long_named(n: int) -> int:
    return n


@pytest.mark.parametrize("columns", [80, 100])
def test_a_narrow_list_keeps_every_column_and_whole_times(sqlite_url: str, columns: int) -> None:
    """Long ids and names fold; the status, the queue and the time of creation stay whole
    (before: at 80 columns the created column was dropped and the queue's header cut to
    'qu'; at 100 each time was cut to '22:47', a time that looks right and is not)."""
    long_id = "order-2026-11-30-customer-4417-waiting-for-the-warehouse-signal"
    with durably.Client(sqlite_url) as client:
        client.start(long_named, 1, workflow_id=long_id)
        client.start(long_named, 2, workflow_id="short-1")
        durably.Queue("cli_q").enqueue_sync(client, two_args, 1, 2, workflow_id="queued-1")
        created = {w.workflow_id: w.created_at for w in client.list_workflows()}
    result = invoke(sqlite_url, "list", columns=columns)
    assert result.exit_code == 0, result.output
    lines = _lines(result)
    assert all(len(line) <= columns for line in lines), result.output
    assert lines[0].split() == ["id", "workflow", "status", "queue", "created"], result.output
    for wid in ("short-1", "queued-1", long_id):
        [row] = [line for line in lines if line.startswith(wid[:36])]
        assert "pending !" in row, result.output
        when = time.strftime("%H:%M:%S", time.localtime(created[wid]))
        assert row.rstrip().endswith(when), (when, result.output)
    assert any("cli_q" in line for line in lines if line.startswith("queued-1")), result.output
    # the id folds whole: its pieces, read down the column, are the id
    start = next(i for i, line in enumerate(lines) if line.startswith(long_id[:36]))
    width = len(lines[0]) - len(lines[0].lstrip("id").lstrip())
    pieces = [line[:width].strip() for line in lines[start : start + 3]]
    assert "".join(pieces).startswith(long_id), (pieces, result.output)


@durably.step(name="look_up_the_order_and_its_customer_history")
async def long_step(n: int) -> dict[str, Any]:
    return {"order": n, "lines": [{"sku": f"SKU-{i:04d}", "qty": i} for i in range(12)]}


@durably.workflow(name="cli_long_receipts")
async def long_receipts() -> Any:
    await long_step(1)
    await durably.sleep(0.01)
    return await durably.run_step(lambda: "x" * 300, name="a_step_named_wider_than_the_call_column")


@pytest.mark.parametrize("columns", [80, 120])
def test_show_fits_its_receipts_to_the_terminal(sqlite_url: str, columns: int) -> None:
    """Each receipt row fits the terminal, the output cut to what is left of it (before:
    rows of 110 to 130 characters, whatever the width: each wrapped on an 80-column
    terminal into the next row's place)."""
    durably.run(long_receipts, workflow_id="receipts", database=sqlite_url)
    result = invoke(sqlite_url, "show", "receipts", columns=columns)
    assert result.exit_code == 0, result.output
    rows = [line for line in _lines(result) if line[:4].strip().isdigit()]
    assert len(rows) == 3, result.output
    assert all(len(line) <= columns for line in rows), result.output
    assert "look_up_the_order_and_its_customer_history" in rows[0], result.output
    assert '{"order":1,' in rows[0], result.output  # as much of it as the room holds
    assert ('"lines":[{"sku":"SKU-0000"' in rows[0]) == (columns > 100), result.output
    assert "a_step_named_wider_than_the_call_column" in rows[2], result.output
    # a call cut to its column keeps its status whole: an open call must read as one
    cut = cli_workflows._cut("signal() approval:refund-8190e3cf7947 (started)", 30)
    assert cut == "signal() approval:r… (started)" and len(cut) == 30


def test_workers_fit_80_columns(sqlite_url: str) -> None:
    eid = f"a-rather-long-host-name.example.internal:{os.getpid()}:0123abcd"
    me = journal.ExecutorInfo(eid, "host", 1, "t", time.time(), time.time())
    served = tuple((f"workflow_number_{i}", None, "0123456789abcdef") for i in range(6))
    run_verb(sqlite_url, "register_executor", dataclasses.replace(me, workflows=served))
    result = invoke(sqlite_url, "workers", columns=80)
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in _lines(result)), result.output
    assert any(eid in line for line in _lines(result)), result.output
    assert "workflow_number_5" in result.output and "queues: (none)" in result.output


def test_the_crash_table_fits_80_columns() -> None:
    report = _report(step="issue_refund_to_the_customer")
    lines = report.table(width=80).splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    for spec in (
        "before_call:issue_refund_to_the_customer@1",
        "after_call:issue_refund_to_the_customer@1",
        "calls issue_refund_to_the_customer=2",
    ):
        assert any(spec in line for line in lines), "\n".join(lines)


# --- 5. resume and fork run in place, like start -------------------------------------------


def test_resume_and_fork_run_in_place_by_default(sqlite_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    with pytest.raises(RuntimeError, match="the flag is still there"):
        durably.run(once_broken, str(flag), workflow_id="wf", database=sqlite_url)
    flag.unlink()
    resumed = invoke(sqlite_url, "resume", "wf", "tests.test_cli")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.output.strip() == '"fixed"'
    forked = invoke(sqlite_url, "fork", "wf", "tests.test_cli", "--from-seq", "0", "--id", "f2")
    assert forked.exit_code == 0, forked.output
    assert forked.output.split() == ["f2", '"fixed"']
    with durably.Client(sqlite_url) as client:
        assert client.get_workflow("wf").status == "completed"
        assert client.get_workflow("f2").status == "completed"
        left = client.fork("wf", 0, "f3")
    assert left == "f3"
    # --no-wait leaves it to a worker
    nowait = invoke(sqlite_url, "fork", "wf", "--from-seq", "0", "--id", "f4", "--no-wait")
    assert nowait.exit_code == 0 and nowait.output.strip() == "f4"
    with durably.Client(sqlite_url) as client:
        assert client.get_workflow("f4").status == "pending"
    for command in ("resume", "fork"):
        text = invoke(sqlite_url, command, "--help").output
        assert "By default it runs here" in text and "--no-wait" in text


def test_resume_in_place_without_the_code_changes_nothing(sqlite_url: str) -> None:
    new = base.NewWorkflow("x", "cli_code_elsewhere", '{"args":[],"kwargs":{}}', None, None)
    commit(sqlite_url, new, owner="ex-a")
    run_verb(sqlite_url, "finish_workflow", "x", 1, "failed", None, '{"message":"no"}', [], 2.0)
    result = invoke(sqlite_url, "resume", "x", "tests.test_cli")
    assert result.exit_code != 0
    assert "runs the workflow 'cli_code_elsewhere', which MODULES (tests.test_cli) did not" in (
        result.output
    )
    assert "give the module that defines it" in result.output and "--no-wait" in result.output
    with durably.Client(sqlite_url) as client:
        assert client.get_workflow("x").status == "failed"  # nothing changed


# --- 6. work on a queue that the enqueuing engine does not serve ----------------------------


def test_enqueuing_on_a_queue_the_engine_does_not_serve_warns_once(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    llm = durably.Queue("cli_llm")

    async def main() -> None:
        async with durably.Engine(sqlite_url, poll_interval=0.05) as engine:
            for i in range(3):
                await llm.enqueue(engine, two_args, i, 1, workflow_id=f"q{i}")
        async with durably.Engine(sqlite_url, poll_interval=0.05, queues=[llm]) as worker:
            handle = await llm.enqueue(worker, two_args, 5, 1, workflow_id="served")
            assert await handle.result(timeout=20) == 6

    with caplog.at_level(logging.WARNING, logger="durably"):
        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if "does not serve" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'cli_llm'" in warned[0] and "queues=[" in warned[0]


def test_list_shows_the_queue_and_that_nobody_serves_it(sqlite_url: str) -> None:
    q = durably.Queue("cli_unserved")
    with durably.Client(sqlite_url) as client:
        q.enqueue_sync(client, two_args, 1, 2, workflow_id="queued")

    async def main() -> None:
        async with durably.Engine(sqlite_url, poll_interval=0.05):  # has the code, not the queue
            result = await asyncio.to_thread(invoke, sqlite_url, "list")
            line = next(ln for ln in _lines(result) if ln.startswith("queued"))
            assert "cli_unserved" in line
            assert "no running worker with its code serves queue 'cli_unserved'" in " ".join(
                _lines(result)
            )

    asyncio.run(main())


# --- 7. code that is not the code that started it; code that nobody runs -----------------

OTHER = "0123456789abcdef"


def _other_code(url: str, wid: str) -> None:
    """Commit a start of ``cli_two_args`` as another application's code would: its hash."""
    new, _ = operations.new_workflow(two_args, (2, 3), {}, wid)
    commit(url, dataclasses.replace(new, source_hash=OTHER))


def test_other_code_runs_it_with_a_warning_naming_both_hashes(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _other_code(store_url, "other")
    mine = two_args.definition.source_hash
    assert mine is not None and mine != OTHER

    async def main() -> None:
        async with durably.Engine(store_url, poll_interval=0.05) as engine:
            assert await engine.handle("other").result(timeout=20) == 5

    with caplog.at_level(logging.WARNING, logger="durably"):
        asyncio.run(main())
    warned = [r for r in caplog.records if "was started by code" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "other" in warned[0].getMessage()
    assert OTHER in warned[0].getMessage() and mine in warned[0].getMessage()


def test_other_code_is_warned_about_once_per_workflow_not_at_each_wake_up(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    new, _ = operations.new_workflow(sleeper, (4,), {}, "naps")
    commit(sqlite_url, dataclasses.replace(new, source_hash=OTHER))

    async def main() -> None:
        async with durably.Engine(sqlite_url, poll_interval=0.02, hold_seconds=0) as engine:
            assert await engine.handle("naps").result(timeout=20) == 4
            assert len([c for c in await engine.claims("naps")]) >= 3  # claimed at each wake

    with caplog.at_level(logging.WARNING, logger="durably"):
        asyncio.run(main())
    warned = [r for r in caplog.records if "was started by code" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]


def test_strict_code_leaves_it_for_another_worker_without_claiming_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _other_code(store_url, "other")
    mine = two_args.definition.source_hash
    assert mine is not None

    async def main() -> None:
        async with durably.Engine(store_url, poll_interval=0.02, strict_code=True) as engine:
            await async_wait_for(
                lambda: any("strict_code" in r.getMessage() for r in caplog.records),
                "the strict engine's warning",
            )
            # passes go on: work of the same code is claimed and run meanwhile
            for i in range(3):
                handle = await engine.start(two_args, i, 1, workflow_id=f"mine{i}")
                assert await handle.result(timeout=20) == i + 1
            await _next_scan(engine)
            listed = await asyncio.to_thread(invoke, store_url, "list")
            shown = await asyncio.to_thread(invoke, store_url, "show", "other")
            info = await engine.get_workflow("other")
            assert (info.status, info.owner, info.epoch, info.crash_count) == (
                "pending",
                None,
                0,
                0,
            )
            assert await engine.claims("other") == []
        note = f"other code: started by source {OTHER}, workers have {mine}"
        assert note in " ".join(listed.output.split()), listed.output
        assert f"note: {note}" in shown.output, shown.output

    with caplog.at_level(logging.WARNING, logger="durably"):
        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if "strict_code" in r.getMessage()]
    assert len(warned) == 1, warned  # once per engine
    assert OTHER in warned[0] and mine in warned[0]


async def _next_scan(engine: durably.Engine) -> None:
    """Wait until the engine has looked for unclaimed work once more."""
    scanned = engine._scanned_at
    await async_wait_for(lambda: engine._scanned_at > scanned, "another scan of unclaimed work")


def test_a_strict_worker_process_leaves_other_code_alone(sqlite_url: str, tmp_path: Path) -> None:
    """`durably worker MODULE --strict-code`, a real process: it runs work of its own code
    and never claims the workflow another application's code started."""
    _other_code(sqlite_url, "other")
    log = tmp_path / "worker.log"
    env = children.child_env(drop=())
    argv = [sys.executable, "-m", "durably.cli", "-d", sqlite_url, "worker", "tests.test_cli"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*argv, "--strict-code", "--poll", "0.05"], stdout=out, stderr=out, env=env
        )
    try:
        wait_for(lambda: "strict_code" in log.read_text(), "the worker's warning")
        with durably.Client(sqlite_url) as client:
            client.start(two_args, 1, 2, workflow_id="mine")
            wait_for(lambda: client.get_workflow("mine").finished, "its own work to be run")
            assert client.get_workflow("mine").status == "completed"
            assert client.get_workflow("other").status == "pending"
            assert client.claims("other") == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    assert log.read_text().count("strict_code") == 1, log.read_text()


def test_a_workflow_nobody_has_the_code_of_is_logged_once_and_listed(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with durably.Client(store_url) as client:
        client.start("cli_nobody_has_it", 1, workflow_id="orphan")

    async def main() -> None:
        async with durably.Engine(store_url, poll_interval=0.02) as engine:
            await async_wait_for(
                lambda: any("orphan" in r.getMessage() for r in caplog.records),
                "the warning about the workflow nobody runs",
            )
            for _ in range(2):  # two more scans: still one line
                await _next_scan(engine)
            listed = await asyncio.to_thread(invoke, store_url, "list")
            workers = await asyncio.to_thread(invoke, store_url, "workers")
            assert engine.executor_id in workers.output
        joined = " ".join(listed.output.split())
        assert "no running worker has workflow 'cli_nobody_has_it'" in joined, listed.output
        assert "cli_two_args" in workers.output and "cli_once_broken" in workers.output

    with caplog.at_level(logging.WARNING, logger="durably"):
        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if "orphan" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "no running worker has registered" in warned[0]
    assert "cli_nobody_has_it" in warned[0]


def test_executors_store_what_they_serve(store_url: str) -> None:
    me = journal.ExecutorInfo("ex-1", "h", 1, "t", 1.0, 1.0)
    served = dataclasses.replace(
        me, workflows=(("a", None, "h1"), ("b", "2", None)), queues=("llm",)
    )
    run_verb(store_url, "register_executor", served)
    (found,) = run_verb(store_url, "list_executors")
    assert found == served
    grown = dataclasses.replace(served, workflows=(*served.workflows, ("c", None, None)))
    run_verb(store_url, "heartbeat", grown, 2.0, 3.0)
    (found,) = run_verb(store_url, "list_executors")
    assert found == dataclasses.replace(grown, heartbeat_at=2.0)
