"""A store error never becomes a silent endless re-run of a step.

The database refuses a write for three kinds of reasons, and each ends in a
recorded state instead of the old loop (the run stopped, the heartbeat let the
workflow go as "held here but nothing runs it", the engine claimed it again as
if nothing had happened and ran the step again, every lease period):

* a value the database cannot hold (a PostgreSQL data error, a constraint):
  the step fails with ``StorageDataError`` naming the refusal, once;
* no room (a full disk, a file-size limit): the run backs off and retries the
  same write, logging loudly, and the step does not run again;
* any other error, or a run whose task died: the release counts as a crash,
  so ``max_recoveries`` ends it as ``failed``.

Every refusal here comes from a real database: a SQLite trigger, a PostgreSQL
constraint or trigger, a LATIN1 PostgreSQL database, a file-size limit in a
child process.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import durably
from durably import errors
from tests.crashkit.harness import child_env

RUNS: list[str] = []


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    RUNS.clear()


@durably.step
def se_echo(text: str) -> str:
    RUNS.append("se_echo")
    return text


@durably.workflow
async def se_returns(text: str) -> str:
    return await se_echo(text)


# --- refusals made by the database itself ------------------------------------------------


def _sqlite_path(url: str) -> str:
    return url[len("sqlite:///") :]


def refuse_poison(url: str, how: str) -> None:
    """Make the database refuse journal payloads that contain "poison".

    ``data``: as a value it cannot hold (SQLite trigger RAISE, PostgreSQL CHECK);
    ``other``: with an error that says nothing about the value (SQLite: a
    trigger writing to a table that is gone; PostgreSQL: RAISE EXCEPTION);
    ``full``: PostgreSQL's disk_full, counting each refusal in a sequence.
    """
    with durably.Client(url) as client:  # the schema exists before the refusal is installed
        client.open()
    if url.startswith("sqlite"):
        conn = sqlite3.connect(_sqlite_path(url), isolation_level=None)
        body = {
            "data": "SELECT RAISE(ABORT, 'refused by a test trigger');",
            "other": "INSERT INTO se_gone VALUES (1);",
        }[how]
        conn.execute("CREATE TABLE se_gone (x)")
        for event in ("INSERT", "UPDATE"):
            conn.execute(
                f"CREATE TRIGGER se_refuse_{event.lower()} BEFORE {event} ON journal "
                f"WHEN NEW.payload LIKE '%poison%' BEGIN {body} END"
            )
        conn.execute("DROP TABLE se_gone")
        conn.close()
        return
    with psycopg.connect(url, autocommit=True, options="-c search_path=durably") as conn:
        if how == "data":
            conn.execute(
                "ALTER TABLE journal ADD CONSTRAINT se_refuse_marked "
                "CHECK (payload IS NULL OR payload NOT LIKE '%poison%')"
            )
            return
        raise_it = {
            "other": "RAISE EXCEPTION 'refused by a test trigger'",
            "full": "PERFORM nextval('se_refusals'); "
            "RAISE EXCEPTION 'no room' USING ERRCODE = 'disk_full'",
        }[how]
        conn.execute("CREATE SEQUENCE se_refusals")
        conn.execute(
            "CREATE FUNCTION se_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.payload LIKE '%poison%' THEN {raise_it}; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER se_refuse BEFORE INSERT OR UPDATE ON journal "
            "FOR EACH ROW EXECUTE FUNCTION se_refuse()"
        )


async def await_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


# --- 1. a value the database refuses fails the step once -------------------------------------


async def test_a_refused_receipt_fails_the_step_once(store_url: str) -> None:
    refuse_poison(store_url, "data")
    async with durably.Engine(store_url, lease_seconds=1.0) as engine:
        handle = await engine.start(se_returns, "a poison pill", workflow_id="refused")
        with pytest.raises(errors.StorageDataError) as caught:
            await handle.result(timeout=30)
        assert await handle.status() == "failed"
        (entry,) = await engine.history("refused")
    message = str(caught.value)
    assert "se_echo" in message and "refused" in message
    assert ("test trigger" in message) if "sqlite" in store_url else ("se_refuse_marked" in message)
    assert (entry.name, entry.status) == ("se_echo", "failed")
    assert RUNS == ["se_echo"]


@durably.workflow
async def se_publishes_while_waiting() -> None:
    async def publish() -> None:
        await asyncio.sleep(0.2)  # after the wait below is committed, before the run parks
        durably.set_event("verdict", "poison")

    await asyncio.gather(durably.wait_for_signal("go"), publish())


async def test_a_value_refused_when_the_run_parks_fails_the_workflow(store_url: str) -> None:
    refuse_poison(store_url, "data")
    async with durably.Engine(store_url, lease_seconds=1.0, hold_seconds=0.5) as engine:
        handle = await engine.start(se_publishes_while_waiting, workflow_id="parks")
        with pytest.raises(errors.StorageDataError, match="refused a value"):
            await handle.result(timeout=30)
        info = await engine.get_workflow("parks")
        history = await engine.history("parks")
    assert (info.status, info.crash_count) == ("failed", 0)
    assert [e.kind for e in history] == ["signal"]  # the wait; the refused event is dropped


# --- 2. any other store error: abandoned, counted, given up after max_recoveries ----------------


async def test_a_run_that_keeps_failing_to_commit_is_counted_and_given_up(store_url: str) -> None:
    refuse_poison(store_url, "other")
    async with durably.Engine(store_url, lease_seconds=1.0, max_recoveries=2) as engine:
        handle = await engine.start(se_returns, "poison again", workflow_id="abandoned")
        with pytest.raises(durably.WorkflowFailed, match="crashed its executor 3 times"):
            await handle.result(timeout=60)
        info = await engine.get_workflow("abandoned")
    assert (info.status, info.crash_count) == ("failed", 3)
    assert RUNS == ["se_echo"] * 3  # the first run and two recoveries; never more


class Vanish(BaseException):
    """Not an Exception: ends the workflow's task without any recorded outcome."""


VANISHED: list[int] = []


@durably.workflow
async def se_vanishes() -> None:
    VANISHED.append(1)
    raise Vanish("gone without a trace")


async def test_a_run_whose_task_dies_is_logged_and_counted(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    VANISHED.clear()
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unhandled.append(ctx))
    caplog.set_level(logging.ERROR, logger="durably")
    async with durably.Engine(store_url, lease_seconds=1.0, max_recoveries=1) as engine:
        handle = await engine.start(se_vanishes, workflow_id="vanishes")
        with pytest.raises(durably.WorkflowFailed, match="crashed its executor 2 times"):
            await handle.result(timeout=60)
        info = await engine.get_workflow("vanishes")
    assert (info.status, info.crash_count) == ("failed", 2)
    assert VANISHED == [1, 1]
    deaths = [
        r for r in caplog.records if r.exc_info is not None and isinstance(r.exc_info[1], Vanish)
    ]
    assert len(deaths) == 2 and all("vanishes" in r.getMessage() for r in deaths)
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []


# --- 3. a value PostgreSQL cannot hold (a data exception), and the same on SQLite ----------------


@pytest.fixture(params=["server", "client"])
def latin1_url(request: pytest.FixtureRequest, pg_cluster: Any) -> Iterator[str]:
    """A durably database in a LATIN1 PostgreSQL database (a legacy server's default).

    ``server``: the client sends UTF-8 and the server refuses what LATIN1
    cannot hold (SQLSTATE 22P05); ``client``: libpq's encoding is the
    database's, and the driver cannot encode the value at all.
    """
    name = f"latin1_{request.param}_{os.getpid()}"
    pg_cluster.execute(
        f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    query = "?client_encoding=UTF8" if request.param == "server" else ""
    yield pg_cluster.url(name) + query
    pg_cluster.drop_database(name)


TEXT = "東京 café"  # é fits LATIN1; the kanji do not


@durably.step
def se_text() -> str:
    RUNS.append("se_text")
    return TEXT


@durably.workflow
async def se_returns_text() -> str:
    return await se_text()


async def test_a_result_postgresql_cannot_hold_fails_the_workflow_once(latin1_url: str) -> None:
    async with durably.Engine(latin1_url, lease_seconds=1.0) as engine:
        handle = await engine.start(se_returns_text, workflow_id="latin1")
        with pytest.raises(errors.StorageDataError) as caught:
            await handle.result(timeout=30)
        assert await handle.status() == "failed"
        (entry,) = await engine.history("latin1")
    message = str(caught.value)
    assert "se_text" in message and "latin1" in message
    if "client_encoding" in latin1_url:
        assert "22P05" in message and 'has no equivalent in encoding "LATIN1"' in message
    else:
        assert "can't encode" in message
    assert entry.status == "failed"
    assert RUNS == ["se_text"]


async def test_the_same_result_completes_once_on_sqlite(sqlite_url: str) -> None:
    async with durably.Engine(sqlite_url, lease_seconds=1.0) as engine:
        handle = await engine.start(se_returns_text, workflow_id="utf8")
        assert await handle.result(timeout=30) == TEXT
    assert RUNS == ["se_text"]


class Refusal(Exception):
    pass


@durably.step(retry=durably.Retry(max_attempts=2, initial=0.0, jitter=0))
def se_raises_text() -> None:
    RUNS.append("se_raises_text")
    raise Refusal(f"the service said: {TEXT}")


@durably.workflow
async def se_fails() -> None:
    await se_raises_text()


async def test_an_error_postgresql_cannot_hold_is_recorded_and_retried_as_declared(
    latin1_url: str,
) -> None:
    async with durably.Engine(latin1_url, lease_seconds=1.0) as engine:
        handle = await engine.start(se_fails, workflow_id="latin1-error")
        with pytest.raises(Refusal) as caught:
            await handle.result(timeout=30)
        assert await handle.status() == "failed"
        (entry,) = await engine.history("latin1-error")
    assert str(caught.value) == f"the service said: {TEXT}"  # nothing of it is lost
    assert (entry.status, entry.attempt) == ("failed", 2)
    assert RUNS == ["se_raises_text"] * 2  # its Retry policy, no more


# --- 4. no room: back off, don't run the step again ---------------------------------------------


async def test_a_full_postgresql_backs_off_and_completes_once_room_returns(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_poison(postgres_url, "full")
    caplog.set_level(logging.ERROR, logger="durably")
    with psycopg.connect(postgres_url, autocommit=True, options="-c search_path=durably") as admin:

        def refusals() -> int:
            row = admin.execute("SELECT last_value, is_called FROM se_refusals").fetchone()
            assert row is not None
            return int(row[0]) if row[1] else 0

        async with durably.Engine(postgres_url, lease_seconds=1.0) as engine:
            started = time.monotonic()
            handle = await engine.start(se_returns, "poison needs room", workflow_id="full")
            # Four leases' worth of refused commits, each the same write tried again.
            await await_for(
                lambda: refusals() >= 5 and time.monotonic() - started > 4.0,
                "five refused commits over four leases",
            )
            info = await engine.get_workflow("full")
            assert (info.status, info.crash_count) == ("running", 0)
            assert len(await engine.claims("full")) == 1
            assert RUNS == ["se_echo"]
            admin.execute("DROP TRIGGER se_refuse ON journal")  # room again
            assert await handle.result(timeout=60) == "poison needs room"
    assert RUNS == ["se_echo"]
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR and "full" in r.getMessage()]
    assert loud and "PostgreSQL database" in loud[0].getMessage()


def _run_child(db: Path, effects: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "tests.storefull_child", "--db", str(db), "--effects"]
    proc = subprocess.run(
        [*argv, str(effects), *extra],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"child printed nothing (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(lines[-1])
    seen["returncode"] = proc.returncode
    seen["stderr"] = proc.stderr
    return seen


def _effects(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_file_size_limit_backs_off_and_completes_once_room_returns(tmp_path: Path) -> None:
    db, effects = tmp_path / "full.db", tmp_path / "effects.txt"
    seen = _run_child(db, effects, "--phase", "full", "--full-seconds", "5", "--lift")
    assert seen["returncode"] == 0, seen["stderr"][-4000:]
    # While full (five leases): the receipt never fit, the step ran once, nobody re-claimed it.
    assert seen["result_while_full"] is None
    assert (seen["status_while_full"], seen["crash_count_while_full"]) == ("running", 0)
    assert seen["journal_while_full"] == []
    assert seen["claims_while_full"] == 1
    assert "StorageFull" in seen["stderr"] and "file-size limit" in seen["stderr"]
    # Room again in the same process: the held result commits.
    assert (seen["result"], seen["status"]) == (2_000_000, "completed")
    assert _effects(effects) == 1


def test_a_process_killed_while_full_is_recovered_by_the_next_one(tmp_path: Path) -> None:
    db, effects = tmp_path / "full.db", tmp_path / "effects.txt"
    seen = _run_child(db, effects, "--phase", "full", "--full-seconds", "4")
    assert seen["returncode"] == -9
    assert (seen["status_while_full"], seen["journal_while_full"]) == ("running", [])
    assert _effects(effects) == 1
    after = _run_child(db, effects, "--phase", "resume")
    assert (after["result"], after["status"]) == (2_000_000, "completed")
    assert _effects(effects) == 2  # promise 3: an interrupted step runs again, once
