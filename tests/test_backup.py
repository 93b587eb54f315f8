"""Backups: ``durably backup PATH`` copies a SQLite database while a worker runs; the copy
restores and finishes what was unfinished. PostgreSQL gets its documented procedure."""

from __future__ import annotations

import asyncio
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import durably
from tests import children
from tests import ops_flows as flows
from tests.test_archive import run_cli
from tests.test_retention import REPO, statuses, wait_for, worker


def test_a_backup_taken_mid_run_restores_and_finishes_the_unfinished(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    runs = [f"s{i}" for i in range(16)]
    waiters = [f"w{i}" for i in range(3)]
    with durably.Client(url) as client:
        for i, wid in enumerate(runs):  # of 2 to 17 steps: they finish one after the other
            client.start(flows.steps, wid, 2 + i, workflow_id=wid)
        for wid in waiters:
            client.start(flows.waiter, wid, workflow_id=wid)
    backup = tmp_path / "backup.db"
    with worker(url, tmp_path, tmp_path / "effects", step_seconds=0.15):

        def midway() -> bool:
            now = statuses(url)
            done = sum(now[w] == "completed" for w in runs)
            return done >= 2 and done <= len(runs) - 4

        wait_for(midway, f"some workflows to finish and others to be under way: {statuses(url)}")
        env = children.child_env()
        out = subprocess.run(
            [sys.executable, "-m", "durably.cli", "--database", url, "backup", str(backup)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    conn = sqlite3.connect(backup)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    restored = f"sqlite:///{backup}"
    at_backup = statuses(restored)
    unfinished = [w for w in runs if at_backup[w] != "completed"]
    assert len(unfinished) >= 4 and len(unfinished) <= len(runs) - 2  # taken mid-run

    async def finish() -> None:
        async with durably.Engine(restored, poll_interval=0.1, lease_seconds=2) as e:
            for wid in waiters:
                await e.send_signal(wid, "go", wid)
            for i, wid in enumerate(runs):
                assert await e.handle(wid).result(timeout=60) == sum(range(1, 3 + i))
            for wid in waiters:
                assert await e.handle(wid).result(timeout=60) == [1, wid, 2]

    asyncio.run(finish())


def test_backup_never_overwrites_a_file(sqlite_url: str, tmp_path: Path) -> None:
    with durably.Client(sqlite_url):
        pass
    taken = tmp_path / "taken.db"
    taken.write_text("keep me")
    result = run_cli(sqlite_url, "backup", str(taken))
    assert result.exit_code == 1 and "never overwrites" in result.output
    assert taken.read_text() == "keep me"


def test_postgres_backup_gives_the_procedure(postgres_url: str, tmp_path: Path) -> None:
    result = run_cli(postgres_url, "backup", str(tmp_path / "x.dump"))
    assert result.exit_code == 1
    assert "pg_dump --schema=durably" in result.output
    assert not (tmp_path / "x.dump").exists()


@pytest.mark.parametrize(
    "command",
    [("backup", "copy.db"), ("export",), ("prune", "--finished-before", "30d")],
)
def test_a_mistyped_database_path_is_an_error_not_a_new_empty_database(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """backup, export and prune read a database that must exist: a mistyped path used to
    create an empty one there, and a backup of it reported success (an empty "backup")."""
    missing = tmp_path / "typo.db"
    args = [str(tmp_path / a) if a.endswith(".db") else a for a in command]
    result = run_cli(f"sqlite:///{missing}", *args)
    assert result.exit_code == 1, result.output
    assert str(missing) in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created


def _big_database(tmp_path: Path) -> str:
    """A durably SQLite file of about 64 MiB, so that copying it takes a while."""
    url = f"sqlite:///{tmp_path / 'big.db'}"
    with durably.Client(url):
        pass
    conn = sqlite3.connect(tmp_path / "big.db")
    conn.execute("CREATE TABLE ballast (b BLOB)")
    conn.executemany("INSERT INTO ballast VALUES (randomblob(1048576))", [()] * 64)
    conn.commit()
    conn.close()
    return url


def test_backup_leaves_an_existing_partial_named_file_alone(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The copy is written beside PATH under a name of its own: a file already named
    PATH.partial (someone else's) used to be deleted, then overwritten."""
    with durably.Client(sqlite_url):
        pass
    theirs = tmp_path / "copy.db.partial"
    theirs.write_text("not durably's")
    result = run_cli(sqlite_url, "backup", str(tmp_path / "copy.db"))
    assert result.exit_code == 0, result.output
    assert theirs.read_text() == "not durably's"
    conn = sqlite3.connect(tmp_path / "copy.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_a_backup_killed_midway_leaves_nothing_under_its_name(tmp_path: Path) -> None:
    """PATH appears only once the copy is complete: a backup killed while copying used
    to leave an empty file under PATH, which opens as an empty database (a "backup"
    restoring to nothing)."""
    url = _big_database(tmp_path)
    target = tmp_path / "copy.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "durably.cli", "--database", url, "backup", str(target)],
        cwd=REPO, env=children.child_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while proc.poll() is None and not target.exists():
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)  # at the first sight of PATH
    finally:
        proc.wait()
    if target.exists():  # then only as the finished copy
        conn = sqlite3.connect(target)
        assert conn.execute("SELECT count(*) FROM ballast").fetchone() == (64,)
        conn.close()


def _limit_file_size(size: int) -> Callable[[], None]:
    """A preexec_fn giving the process a file-size limit (``ulimit -f``): a write past it
    fails as on a full disk (EFBIG; Python ignores SIGXFSZ), without root or a mount."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def test_a_path_naming_a_directory_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    """``copy.db/`` names a directory, which no copy can become: refused at once, not
    after copying the whole database (here the copy would have run out of room)."""
    url = _big_database(tmp_path)
    target = str(tmp_path / "copy.db") + "/"
    proc = subprocess.run(
        [sys.executable, "-m", "durably.cli", "--database", url, "backup", target],
        cwd=REPO, env=children.child_env(), capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_file_size(1 << 20),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"error: cannot create the backup {target!r}: it names a directory, not a file"
    )


@pytest.mark.parametrize("case", ["no room", "a directory path", "missing directory"])
def test_a_failed_backup_is_one_line_naming_the_path_and_leaves_nothing(
    tmp_path: Path, case: str
) -> None:
    """A backup that fails on the file system is one line naming PATH and why, exit 1:
    a path naming a directory (an OSError from publishing the copy) used to end in a
    traceback, and a copy that ran out of room blamed the database being copied ("has no
    room to write ... runs wait and retry their writes") and left its -journal behind."""
    url = _big_database(tmp_path)  # 64 MiB
    out = tmp_path / "out"
    out.mkdir()
    target = {
        "no room": str(out / "copy.db"),
        "a directory path": str(out / "copy.db") + "/",
        "missing directory": str(out / "nowhere" / "copy.db"),
    }[case]
    limit = _limit_file_size(8 << 20) if case == "no room" else None
    proc = subprocess.run(
        [sys.executable, "-m", "durably.cli", "--database", url, "backup", target],
        cwd=REPO, env=children.child_env(), capture_output=True, text=True, timeout=120,
        preexec_fn=limit,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: cannot create the backup {target!r}: "), lines[0]
    assert "big.db" not in lines[0]  # the database copied is not what failed
    assert sorted(p.name for p in out.iterdir()) == []  # no copy, no partial, no journal
