"""Bad input gets a clear durably error that names what was wrong, and harms nothing.

Unknown workflow ids, step results that cannot be stored, files that are not
durably databases, a database this user cannot write, and workflow id clashes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sqlite3
import tempfile
import threading
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import durably
from tests.crashkit import flows
from tests.crashkit.harness import count_by_step, journal_rows, read_effects

T = TypeVar("T")


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(flows.EFFECTS_ENV, str(path))
    return path


def with_engine(db: Path, body: Callable[[durably.Engine], Awaitable[T]]) -> T:
    """Run ``body(engine)`` with an engine open on ``db``, in this process."""

    async def main() -> T:
        async with durably.Engine(f"sqlite:///{db}") as engine:
            return await body(engine)

    return asyncio.run(main())


# --- unknown workflow ids -------------------------------------------------------------


@pytest.mark.parametrize("call", ["get_workflow", "history", "handle_result"])
def test_unknown_workflow_id_raises_workflow_not_found(tmp_path: Path, call: str) -> None:
    async def body(engine: durably.Engine) -> Any:
        if call == "handle_result":
            return await engine.handle("no-such-workflow").result(timeout=5)
        return await getattr(engine, call)("no-such-workflow")

    with pytest.raises(durably.WorkflowNotFound, match="no-such-workflow"):
        with_engine(tmp_path / "durably.db", body)


# --- step results that cannot be stored ------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "step", "type_name"),
    [("socket", "returns_socket", "socket"), ("lambda", "returns_lambda", "function")],
)
def test_unencodable_step_result_fails_the_workflow_with_encode_error(
    tmp_path: Path, effects: Path, kind: str, step: str, type_name: str
) -> None:
    db = tmp_path / "durably.db"

    async def body(engine: durably.Engine) -> Any:
        handle = await engine.start(flows.unencodable, kind, workflow_id="wf-enc")
        with pytest.raises(durably.EncodeError) as caught:
            await handle.result(timeout=10)
        return caught.value, await handle.status()

    error, status = with_engine(db, body)
    assert status == "failed"
    assert step in str(error), str(error)
    assert type_name in str(error), str(error)
    rows = journal_rows(db, "wf-enc")
    assert [(r["name"], r["status"]) for r in rows] == [
        ("step_a", "completed"),
        (step, "failed"),
    ]
    assert rows[0]["payload"] == "2"  # the earlier receipt is kept as it was
    assert count_by_step(read_effects(effects)) == {"step_a": 1, step: 1}


# --- files that are not durably databases ----------------------------------------------


def _open_engine(db: Path) -> None:
    async def body(engine: durably.Engine) -> None:
        await engine.list_workflows()

    with_engine(db, body)


def test_a_file_of_random_bytes_is_not_a_durably_database(tmp_path: Path) -> None:
    db = tmp_path / "noise.db"
    db.write_bytes(random.Random(4417).randbytes(8192))
    before = db.read_bytes()

    with pytest.raises(durably.NotADurablyDatabase) as caught:
        _open_engine(db)

    assert str(db) in str(caught.value)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noise.db"]


def test_clients_opening_a_new_sqlite_file_at_once_all_open_it(tmp_path: Path) -> None:
    """The first opens of a file switch it to WAL, which needs the file to itself and
    does not wait for it: of several clients opening a new file at once, some were
    refused with DatabaseLocked at once (about one try in ten with six). Now each
    tries again within its busy_timeout, and every one opens and reads it."""
    for trial in range(20):
        url = f"sqlite:///{tmp_path}/new-{trial}.db"
        start = threading.Barrier(6)
        failed: list[str] = []

        def open_and_read(
            url: str = url, start: threading.Barrier = start, failed: list[str] = failed
        ) -> None:
            try:
                start.wait()
                with durably.Client(url) as client:
                    client.list_workflows()
            except Exception as exc:
                failed.append(repr(exc))

        threads = [threading.Thread(target=open_and_read) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert failed == [], f"trial {trial}: {failed[0]}"
        conn = sqlite3.connect(tmp_path / f"new-{trial}.db")
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()


def test_a_sqlite_file_with_other_tables_is_not_a_durably_database(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    conn = sqlite3.connect(db)
    try:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('Ada')")
        conn.commit()
    finally:
        conn.close()
    before = db.read_bytes()

    with pytest.raises(durably.NotADurablyDatabase) as caught:
        _open_engine(db)

    assert str(db) in str(caught.value)
    assert "customers" in str(caught.value)
    assert db.read_bytes() == before, "opening a foreign database changed its bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.db"]


# --- a database this user cannot write --------------------------------------------------

NOBODY = 65534


def _open_as_nobody(db: Path) -> dict[str, Any]:
    """Open an engine on ``db`` in a forked child running as uid/gid 65534 (nobody).

    A fork, not an exec: nobody cannot reach this interpreter under /root, and the
    forked child already has durably imported. It reports what it saw as JSON.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

            async def main() -> str:
                async with durably.Engine(f"sqlite:///{db}") as engine:
                    return (await engine.get_workflow("wf-ro")).status

            try:
                report: dict[str, Any] = {"opened": asyncio.run(main())}
            except Exception as exc:
                report = {
                    "type": type(exc).__name__,
                    "store_error": isinstance(exc, durably.StoreError),
                    "read_only": isinstance(exc, durably.DatabaseReadOnly),
                    "message": str(exc),
                }
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as fh:
        chunks.append(fh.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, chunks
    return json.loads(b"".join(chunks))  # type: ignore[no-any-return]


def _open_in_process(db: Path) -> dict[str, Any]:
    """What opening an engine on ``db`` does in this process, as ``_open_as_nobody``."""

    async def body(engine: durably.Engine) -> str:
        return (await engine.get_workflow("wf-ro")).status

    try:
        return {"opened": with_engine(db, body)}
    except Exception as exc:
        return {
            "type": type(exc).__name__,
            "store_error": isinstance(exc, durably.StoreError),
            "read_only": isinstance(exc, durably.DatabaseReadOnly),
            "message": str(exc),
        }


def test_a_read_only_database_raises_database_read_only(effects: Path) -> None:
    # tmp_path lives under a 0700 directory nobody cannot enter: use a world-readable one
    where = Path(tempfile.mkdtemp(prefix="durably-ro-"))
    try:
        where.chmod(0o755)
        db = where / "ro.db"

        async def make(engine: durably.Engine) -> Any:
            return await (await engine.start(flows.linear, 1, workflow_id="wf-ro")).result(10)

        assert with_engine(db, make) == flows.linear_expected(1)
        files_before = sorted(p.name for p in where.iterdir())
        before = db.read_bytes()
        if os.geteuid() == 0:
            # root ignores file modes: drop to nobody against a root-owned 0644 file
            db.chmod(0o644)
            assert db.stat().st_uid == 0
            seen = _open_as_nobody(db)
        else:
            db.chmod(0o444)
            where.chmod(0o555)
            if os.access(db, os.W_OK):
                pytest.skip("cannot make a file read-only for this user")
            seen = _open_in_process(db)
            where.chmod(0o755)

        assert "opened" not in seen, f"a read-only database was opened for writing: {seen}"
        assert seen["read_only"], f"expected DatabaseReadOnly, got {seen}"
        assert str(db) in seen["message"], seen
        assert db.read_bytes() == before
        assert sorted(p.name for p in where.iterdir()) == files_before

        db.chmod(0o644)

        async def read(engine: durably.Engine) -> Any:
            info = await engine.get_workflow("wf-ro")
            return info.status, await engine.handle("wf-ro").result(timeout=5)

        assert with_engine(db, read) == ("completed", flows.linear_expected(1))
    finally:
        where.chmod(0o755)
        shutil.rmtree(where, ignore_errors=True)


# --- workflow id conflicts ---------------------------------------------------------------


def test_a_different_workflow_under_a_taken_id_conflicts(tmp_path: Path, effects: Path) -> None:
    async def body(engine: durably.Engine) -> Any:
        first = await engine.start(flows.linear, 1, workflow_id="wf-taken")
        result = await first.result(timeout=10)
        with pytest.raises(durably.WorkflowIdConflict) as caught:
            await engine.start(flows.other, 1, workflow_id="wf-taken")
        return result, caught.value, await engine.get_workflow("wf-taken")

    result, error, info = with_engine(tmp_path / "durably.db", body)
    assert result == flows.linear_expected(1)
    assert "wf-taken" in str(error)
    assert info.name == "linear" and info.status == "completed"
    assert count_by_step(read_effects(effects)) == dict.fromkeys(
        ["step_a", "step_b", "step_c", "step_d"], 1
    )


def test_starting_the_same_workflow_twice_runs_it_once(tmp_path: Path, effects: Path) -> None:
    async def body(engine: durably.Engine) -> Any:
        one = await engine.start(flows.linear, 1, workflow_id="wf-twice")
        two = await engine.start(flows.linear, 1, workflow_id="wf-twice")
        results = await asyncio.gather(one.result(timeout=10), two.result(timeout=10))
        three = await engine.start(flows.linear, 1, workflow_id="wf-twice")  # after it ended
        return one, two, three, results, await three.result(timeout=10)

    one, two, three, results, again = with_engine(tmp_path / "durably.db", body)
    assert one.workflow_id == two.workflow_id == three.workflow_id == "wf-twice"
    assert results == [flows.linear_expected(1)] * 2
    assert again == flows.linear_expected(1)
    effects_seen = read_effects(effects)
    assert count_by_step(effects_seen) == dict.fromkeys(["step_a", "step_b", "step_c", "step_d"], 1)
    assert {e["wf"] for e in effects_seen} == {"wf-twice"}


def test_a_seq_no_database_can_hold_is_refused_by_name(store_url: str) -> None:
    """resolve and fork take a seq: one past a BIGINT is a ValueError naming it, from the
    Client and over HTTP (422), not the driver's OverflowError (a 500 before)."""
    from starlette.testclient import TestClient

    from durably.server import app, auth
    from tests.serverkit import harness

    client = durably.Client(store_url)
    client.start("srv-wait", workflow_id="w")
    huge = 10**20
    with pytest.raises(ValueError, match=r"seq=100000000000000000000"):
        client.resolve("w", huge, retry=True, by="ops")
    with pytest.raises(ValueError, match=r"from_seq=100000000000000000000"):
        client.fork("w", from_seq=huge)
    with TestClient(app.create_app(store_url, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        r = c.post(
            f"/api/workflows/w/reviews/{huge}/resolve",
            json={"retry": True},
            headers={"Authorization": f"Bearer {harness.SECRET}"},
        )
    assert r.status_code == 422, r.text
    assert "seq" in r.json()["error"]["message"]
    assert client.get_workflow("w").status == "pending"  # nothing changed
