"""Archives: ``durably export`` and ``durably import`` move whole workflows between databases.

Lossless across SQLite and PostgreSQL (unfinished workflows finish on the other side), and
a bad archive is refused with its line number, nothing of it imported.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably import archive, cli, errors
from durably.storage import base, bulk, create_store
from tests import ops_flows as flows

HANG: dict[str, asyncio.Event] = {}
PAID: list[str] = []


@durably.step(at_most_once=True)
async def pay_once(order: str) -> str:
    PAID.append(order)
    await HANG["gate"].wait()
    return f"paid {order}"


@durably.workflow(name="archive.checkout")
async def checkout(order: str) -> str:
    return await pay_once(order)


def run_cli(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli.main, ["--database", url, *args])
    return result


def dump(url: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every workflow's rows, by id, read through the store's export verb."""
    store = create_store(url)
    store.open()
    try:
        ids = store_call(store, store.export_ids, None, None)
        return {wf.workflow_id: wf.rows for wf in store_call(store, store.export_workflows, ids)}
    finally:
        store.close()


def store_call(store: Any, fn: Any, *args: Any) -> Any:
    """Run one verb in its own transaction, as the store thread would."""
    op = base.Op(fn, args, True)
    store.run_batch([op])
    if op.error is not None:
        raise op.error
    return op.result


def count_workflows(url: str) -> int:
    with durably.Client(url) as client:
        return len(client.list_workflows(limit=10_000))


async def wait_status(engine: durably.Engine, wid: str, status: str) -> None:
    deadline = time.monotonic() + 20
    while (await engine.handle(wid).status()) != status:
        assert time.monotonic() < deadline, f"{wid} never became {status}"
        await asyncio.sleep(0.05)


async def fill_source(url: str, effects: Path) -> None:
    """A completed parent with its child still waiting, a workflow waiting for a signal
    with an event and an unconsumed signal, a step awaiting review, a completed one."""
    async with durably.Engine(url, poll_interval=0.1, hold_seconds=0.05) as e:
        assert await (await e.start(flows.steps, "done", 2, workflow_id="done")).result(5) == 3
        await e.start(flows.waiter, "w", workflow_id="w")
        await e.start(flows.parent, "p", workflow_id="p")
        await wait_status(e, "w", "waiting")
        await wait_status(e, "p", "waiting")
        assert await e.send_signal("w", "other", {"kept": True}, idempotency_key="k-1")
        HANG["gate"] = asyncio.Event()
        await e.start(checkout, "ORD-7", workflow_id="r")
        while not PAID:
            await asyncio.sleep(0.01)
    HANG["gate"].set()  # the engine stopped inside the step: an intent without a receipt
    async with durably.Engine(url, poll_interval=0.1, hold_seconds=0.05) as e:
        await wait_status(e, "r", "needs_review")


async def test_round_trip_sqlite_postgres_sqlite_finishes_parked_workflows(
    sqlite_url: str, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects = tmp_path / "effects"
    monkeypatch.setenv(flows.EFFECTS, str(effects))
    PAID.clear()
    await fill_source(sqlite_url, effects)
    source = dump(sqlite_url)
    assert sorted(source) == ["done", "p", "p-child", "r", "w"]
    assert source["w"]["signals"] and source["w"]["events"] and source["r"]["reviews"]

    exported = run_cli(sqlite_url, "export")
    assert exported.exit_code == 0, exported.output
    path = tmp_path / "a.jsonl"
    path.write_text(exported.stdout)
    head = json.loads(exported.stdout.splitlines()[0])
    assert head["durably_archive"] == archive.FORMAT and head["durably"] == durably.__version__
    imported = run_cli(postgres_url, "import", str(path))
    assert imported.exit_code == 0, imported.output
    assert dump(postgres_url) == source  # every row of every table, value for value

    ran_before = flows.effects(str(effects))
    async with durably.Engine(postgres_url, poll_interval=0.1, hold_seconds=0.05) as e:
        await e.send_signal("w", "go", "yes")
        await e.send_signal("p", "go", "now")
        assert await e.handle("w").result(timeout=10) == [1, "yes", 2]
        assert await e.handle("p").result(timeout=10) == ["child of p", "now"]
        await e.resolve("r", 1, result="paid elsewhere", by="ops")
        assert await e.handle("r").result(timeout=10) == "paid elsewhere"
        assert [s["payload"] for s in await e.signals("w") if s["name"] == "other"]
    # Only what had not run yet ran on PostgreSQL: w's second step; nothing was paid twice.
    assert flows.effects(str(effects)) == [*ran_before, "w:2"]
    assert PAID == ["ORD-7"]

    finished = dump(postgres_url)
    back = run_cli(postgres_url, "export")
    assert back.exit_code == 0, back.output
    path_b = tmp_path / "b.jsonl"
    path_b.write_text(back.stdout)
    other = f"sqlite:///{tmp_path / 'back.db'}"
    assert run_cli(other, "import", str(path_b)).exit_code == 0
    assert dump(other) == finished


def test_every_table_of_the_schema_is_archived_or_declared_apart(store_url: str) -> None:
    store: Any = create_store(store_url)
    store.open()
    try:
        tables = store._table_names()
        assert tables == set(bulk.COLUMNS) | bulk.NOT_PER_WORKFLOW
        for table, columns in bulk.COLUMNS.items():
            cursor = store._execute(f"SELECT * FROM {table} WHERE 1 = 0")
            assert tuple(d[0] for d in cursor.description) == columns, table
    finally:
        store.close()


async def _archive_of_three(url: str, tmp_path: Path) -> list[str]:
    async with durably.Engine(url, poll_interval=0.1) as e:
        for wid in ("a", "b", "c"):
            await (await e.start(flows.steps, wid, 2, workflow_id=wid)).result(5)
    out = run_cli(url, "export")
    assert out.exit_code == 0, out.output
    return list(out.stdout.splitlines())


@pytest.mark.parametrize("damage", ["cut", "garbage", "refused", "no-end", "bad-type"])
async def test_a_damaged_archive_is_refused_by_line_and_nothing_is_imported(
    store_url: str, tmp_path: Path, damage: str
) -> None:
    lines = await _archive_of_three(f"sqlite:///{tmp_path / 'src.db'}", tmp_path)
    assert len(lines) == 5  # header, three workflows, end
    if damage == "cut":
        lines[3] = lines[3][: len(lines[3]) // 2]
    elif damage == "garbage":
        lines[3] = lines[3].replace('"journal"', '"journal" ]]', 1)
    elif damage == "refused":  # valid JSON the database refuses (NOT NULL), on line 4
        record = json.loads(lines[3])
        record["journal"][0]["kind"] = None
        lines[3] = json.dumps(record)
    elif damage == "no-end":
        lines = lines[:4]
    else:
        record = json.loads(lines[3])
        record["workflow"]["epoch"] = [1]
        lines[3] = json.dumps(record)
    path = tmp_path / "damaged.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = run_cli(store_url, "import", str(path))
    assert result.exit_code == 1
    assert "line 4" in result.output, result.output  # the damaged line (or the last one)
    assert count_workflows(store_url) == 0


async def test_importing_an_existing_id_is_refused_and_changes_nothing(
    store_url: str, tmp_path: Path
) -> None:
    lines = await _archive_of_three(f"sqlite:///{tmp_path / 'src.db'}", tmp_path)
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    async with durably.Engine(store_url, poll_interval=0.1) as e:
        await (await e.start(flows.steps, "b", 5, workflow_id="b")).result(5)
    before = dump(store_url)
    result = run_cli(store_url, "import", str(path))
    assert result.exit_code == 1
    assert "'b' already exists" in result.output and "nothing was imported" in result.output
    assert dump(store_url) == before


def test_export_selects_by_id_status_and_date(store_url: str, tmp_path: Path) -> None:
    with durably.Client(store_url) as client:
        client.start(flows.steps, "x", 1, workflow_id="x")
        client.start(flows.steps, "y", 1, workflow_id="y")
    by_id = run_cli(store_url, "export", "y")
    assert [json.loads(x).get("workflow", {}).get("workflow_id") for x in by_id.stdout.split()][
        1:-1
    ] == ["y"]
    by_status = run_cli(store_url, "export", "--status", "completed")
    assert json.loads(by_status.stdout.splitlines()[-1]) == {"end": 0}
    future = run_cli(store_url, "export", "--since", "2999-01-01")
    assert json.loads(future.stdout.splitlines()[-1]) == {"end": 0}
    past = run_cli(store_url, "export", "--since", "2000-01-01T00:00:00")
    assert json.loads(past.stdout.splitlines()[-1]) == {"end": 2}
    missing = run_cli(store_url, "export", "nope")
    assert missing.exit_code == 1 and "'nope'" in missing.output


def test_reading_refuses_a_newer_format_and_what_is_not_an_archive() -> None:
    newer = [json.dumps({"durably_archive": archive.FORMAT + 1, "durably": "9"}), '{"end":0}']
    with pytest.raises(errors.ArchiveError, match="line 1: archive format 2"):
        archive.read(newer, "x.jsonl")
    with pytest.raises(errors.ArchiveError, match=r"x\.jsonl line 1: no durably_archive header"):
        archive.read(['{"workflow_id": "a"}'], "x.jsonl")
    with pytest.raises(errors.ArchiveError, match=r"x\.jsonl is empty"):
        archive.read([], "x.jsonl")


def test_a_postgres_export_reads_each_workflow_in_one_snapshot(postgres_url: str) -> None:
    """A workflow's rows are read table by table; under READ COMMITTED each statement saw
    the commits made since the one before, so a signal consumed between the journal read
    and the signals read was exported consumed at a seq the exported journal lacks (the
    imported workflow then waits for it forever). The rival's commit lands exactly there:
    it holds the signals table until the export waits for it."""
    import psycopg

    from durably.storage import thread

    runner = thread.StoreThread(create_store(postgres_url))
    runner.start()
    rival = psycopg.connect(postgres_url, autocommit=True)
    try:
        rival.execute("SET search_path TO durably")
        rival.execute(
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
            "VALUES ('w', 'n', 'waiting', '[]', 1.0, 1.0)"
        )
        rival.execute(
            "INSERT INTO journal (workflow_id, seq, kind, name, status, payload) "
            "VALUES ('w', 1, 'step', 's', 'completed', '1')"
        )
        rival.execute(
            "INSERT INTO signals (workflow_id, num, name, payload, sent_at) "
            "VALUES ('w', 1, 'go', '\"x\"', 1.0)"
        )
        rival.execute("BEGIN")
        rival.execute("LOCK TABLE signals IN ACCESS EXCLUSIVE MODE")
        export = runner.submit(runner.store.export_workflows, ["w"], write=False)
        deadline = time.monotonic() + 4
        while not rival.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()[0]:
            assert not export.done(), export.exception()
            assert time.monotonic() < deadline, "the export never waited for the signals"
            time.sleep(0.01)
        rival.execute(  # the workflow receives the signal: its entry and its consumption
            "INSERT INTO journal (workflow_id, seq, kind, name, status, payload) "
            "VALUES ('w', 2, 'signal', 'go', 'completed', '\"x\"')"
        )
        rival.execute("UPDATE signals SET consumed_seq = 2 WHERE workflow_id = 'w'")
        rival.execute("COMMIT")
        (wf,) = export.result(timeout=10)
    finally:
        rival.close()
        runner.stop()
    seqs = {r["seq"] for r in wf.rows["journal"]}
    consumed = {r["consumed_seq"] for r in wf.rows["signals"]} - {None}
    assert consumed <= seqs, (wf.rows["journal"], wf.rows["signals"])
