"""``durably bench``: every row timed beside its baseline, in scratch databases beside the
one given (never in it), removed at the end however the run ends.

Speed is never asserted here: only that each figure was measured (positive, its
min/median/max in order, the ratio the medians') and where the run wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from durably import cli
from tests import children

#: A row of the table: its name, durably's cell and unit, the baseline's, the ratio.
ROW = re.compile(
    r"^(?P<row>[a-z0-9-]+) +(?P<dmed>[\d.]+) \[(?P<dlo>[\d.]+)-(?P<dhi>[\d.]+)\] (?P<dunit>\S+)"
    r" +(?P<bmed>[\d.]+) \[(?P<blo>[\d.]+)-(?P<bhi>[\d.]+)\] (?P<bunit>\S+) +(?P<ratio>[\d.]+)x$"
)
#: Each row's units (durably's, the baseline's) where they are not microseconds.
UNITS = {"tp1": ("wf/s", "commit/s"), "rec": ("s", "s"), "pro": ("wf/s", "wf/s")}
ROWS = ["step", "step-sync", "tp1-1", "tp1-10", "tp1-100", "replay", "signal", "recovery"]
ROWS += ["procs-2", "procs-4"]


def _bench(database: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        children.durably_cli(database, "bench", *argv),
        env=children.child_env({"COLUMNS": "80"}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _app_database(tmp_path: Path) -> Path:
    """A database with one finished workflow in it: the user's, which bench must not touch."""
    from durably import Client

    path = tmp_path / "app.db"
    with Client(f"sqlite:///{path}") as client:
        client.start("some-workflow", workflow_id="kept")
    return path


def _scratch_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".durably-bench"))


def test_the_table_has_every_row_beside_its_baseline_and_the_database_is_untouched(
    tmp_path: Path,
) -> None:
    app = _app_database(tmp_path)
    before = {p.name: _digest(p) for p in tmp_path.iterdir()}
    done = _bench(f"sqlite:///{app}", "--quick")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"durably bench: sqlite:///{app} (SQLite FULL)"
    table = [m for m in map(ROW.match, lines) if m]
    assert [m["row"] for m in table] == ROWS
    for m in table:  # each figure measured: median inside [min-max], the ratio the medians'
        for side in ("d", "b"):
            low, median, high = (float(m[f"{side}{k}"]) for k in ("lo", "med", "hi"))
            assert 0 < low <= median <= high, m[0]
        assert (m["dunit"], m["bunit"]) == UNITS.get(m["row"][:3], ("us", "us")), m[0]
        shown = float(m["dmed"]) / float(m["bmed"])
        assert float(m["ratio"]) == pytest.approx(shown, rel=0.1, abs=0.01), m[0]
    for line in lines:  # 80 columns, but the lines that quote the user's paths
        assert len(line) <= 80 or str(tmp_path) in line, line
    assert "round 2/2 done" in done.stderr
    # the user's database and its directory are as they were: nothing left behind
    assert {p.name: _digest(p) for p in tmp_path.iterdir()} == before
    assert _scratch_files(tmp_path) == []


def test_json_gives_each_row_its_figures_and_the_ratio_of_their_medians(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'never-made.db'}?synchronous=normal"
    done = _bench(database, "--quick", "--rounds", "3", "--rows", "step, tp1", "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["setting"] == "SQLite NORMAL"
    assert all(report["load_average"][k] >= 0 for k in ("before", "after"))  # 1-minute, Linux
    assert report["rounds"] == 3
    assert [row["row"] for row in report["rows"]] == ["step", "tp1-1", "tp1-10", "tp1-100"]
    for row in report["rows"]:
        for side in ("durably", "baseline"):
            cell = row[side]
            assert 0 < cell["min"] <= cell["median"] <= cell["max"], row
        assert row["ratio"] == pytest.approx(row["durably"]["median"] / row["baseline"]["median"])
    assert [row["unit"] for row in report["rows"]] == ["us", "wf/s", "wf/s", "wf/s"]
    assert [row["baseline_unit"] for row in report["rows"]] == ["us"] + ["commit/s"] * 3
    assert not (tmp_path / "never-made.db").exists()  # the database given is never made
    assert _scratch_files(tmp_path) == []


def test_an_unknown_row_is_refused_naming_the_rows() -> None:
    result = CliRunner().invoke(cli.main, ["bench", "--rows", "step,stpe"])
    assert result.exit_code == 2
    assert "no row named 'stpe'" in result.output
    assert ", ".join(ROWS) in result.output


def test_a_missing_directory_or_a_memory_database_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    done = _bench(f"sqlite:///{missing / 'x.db'}", "--quick")
    assert done.returncode == 1 and done.stdout == ""  # the error is on stderr
    assert f"no directory {str(missing)!r}" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not missing.parent.exists()
    done = _bench("sqlite:///:memory:", "--quick")
    assert done.returncode == 1 and done.stdout == ""  # the error is on stderr
    assert "measures a database on disk" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    done = _bench(f"sqlite:///{tmp_path / 'x.db'}?busy_timeout=soon", "--quick")
    assert done.returncode == 1 and done.stdout == ""  # the error is on stderr
    assert "bad database URL" in done.stderr and "soon" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _processes_naming(text: str) -> list[str]:
    """The command lines of this machine's processes whose command line or environment
    names ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environment = (entry / "environ").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if text in line or text in environment:
            found.append(line)
    return found


@pytest.mark.parametrize("rows", ["step", "recovery", "procs-4"])
def test_an_interrupted_run_removes_its_scratch_files_and_its_children(
    tmp_path: Path, rows: str
) -> None:
    # interrupted in the step row, or while the recovery row's child process runs, or
    # while the worker processes of a processes row run
    app = _app_database(tmp_path)
    deadline = time.monotonic() + 30
    children_of = {"recovery": "durably.bench.recovery", "procs-4": "durably.bench.processes"}

    def into_the_row() -> None:
        wanted = 2 if rows == "step" else 3  # the recovery or processes row's database too
        while len(_scratch_files(tmp_path)) < wanted:
            assert time.monotonic() < deadline, _scratch_files(tmp_path)
            time.sleep(0.01)
        time.sleep(0.5)  # well into the row
        while rows in children_of:  # until its child runs (after the fresh baseline)
            named = _processes_naming(str(tmp_path))
            child = [line for line in named if children_of[rows] in line]
            if len(child) >= (2 if rows == "procs-4" else 1):  # (procs-4: past its baseline)
                # its database's URL (a password, maybe) is not on its command line
                assert all(str(tmp_path) not in line for line in child), child
                break
            assert time.monotonic() < deadline, f"no {children_of[rows]} child seen"
            time.sleep(0.01)

    _interrupted(f"sqlite:///{app}", ["--rows", rows], signal.SIGINT, into_the_row)
    assert _scratch_files(tmp_path) == []
    assert _processes_naming(str(tmp_path)) == []  # no child left running


def _interrupted(database: str, argv: list[str], signum: int, wait: Callable[[], None]) -> None:
    """Run ``durably bench`` at its full sizes, ``wait`` once it says where it measures,
    send ``signum``: it exits 130, says the scratch is removed, with no traceback."""
    proc = subprocess.Popen(
        children.durably_cli(database, "bench", *argv),
        env=children.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("measuring in "), first
        wait()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted: the scratch databases are removed" in err
    assert "Traceback" not in err


def _pg_state(url: str) -> tuple[list[str], list[tuple[Any, ...]], int]:
    """The database's schemas (but each session's temporary ones, which stay), the rows of
    the user's own workflows (schema ``app``), and how many durably's default schema holds."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%temp\\_%' ORDER BY 1"
        ).fetchall()
        app = conn.execute("SELECT * FROM app.workflows ORDER BY workflow_id").fetchall()
        count = conn.execute("SELECT count(*) FROM durably.workflows").fetchone()
    assert count is not None
    return [str(s[0]) for s in schemas], app, int(count[0])


@pytest.fixture
def app_on_postgres(postgres_url: str) -> str:
    """A database whose durably tables are in the schema ``app``, with one workflow in it."""
    from durably import Client

    with Client(f"{postgres_url}?schema=app") as client:
        client.start("some-workflow", workflow_id="kept")
    return postgres_url


def test_on_postgresql_it_measures_in_scratch_schemas_and_drops_them(
    app_on_postgres: str,
) -> None:
    before = _pg_state(app_on_postgres)
    assert len(before[1]) == 1
    url = f"{app_on_postgres}?schema=app&connections=2&password=sekret"  # (trust: unused)
    done = _bench(url, "--quick", "--rows", "step,tp1-10,signal,recovery,procs-2", "--json")
    assert done.returncode == 0, done.stderr
    assert "sekret" not in done.stdout + done.stderr  # a URL's password is never printed
    report = json.loads(done.stdout)
    assert report["database"] == f"{app_on_postgres}?schema=app&connections=2&password=***"
    assert report["setting"].startswith("PostgreSQL 1")  # the server's version, 13 or later
    assert report["measured_in"].startswith("schemas durably_bench_")  # (recovery: more)
    shown = [row["row"] for row in report["rows"]]
    assert shown == ["step", "tp1-10", "signal", "recovery", "procs-2"]
    for row in report["rows"]:
        assert row["durably"]["median"] > 0 and row["baseline"]["median"] > 0
    assert "durably_bench_" in done.stderr  # it said where it measured
    # no schema left; the schema the URL names and durably's default one as they were
    assert _pg_state(app_on_postgres) == before


def test_sigterm_on_postgresql_drops_the_scratch_schemas(app_on_postgres: str) -> None:
    before = _pg_state(app_on_postgres)

    def into_the_run() -> None:
        time.sleep(0.5)  # well into the warm-up or the first row
        assert len(_pg_state(app_on_postgres)[0]) == len(before[0]) + 2  # both are there

    _interrupted(f"{app_on_postgres}?schema=app", [], signal.SIGTERM, into_the_run)
    assert _pg_state(app_on_postgres) == before


def test_a_worker_process_that_fails_says_why_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # a processes row's child that cannot open its database: the run's error names the
    # child's, no traceback reaches the terminal, and no child is left running
    import asyncio

    from durably.bench import processes

    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'procs.db'}"
    with pytest.raises(RuntimeError, match=r"^a worker process failed: \w+: .*no") as failed:
        asyncio.run(processes.processes_throughput(url, 2, 10, 10, timeout=60))
    assert "\n" not in str(failed.value)
    assert "Traceback" not in capfd.readouterr().err
    assert _processes_naming(str(tmp_path)) == []
