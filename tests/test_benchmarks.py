"""``python -m benchmarks --quick`` runs and prints its one table (speed is never asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from tests import children, pgcluster

REPO = Path(__file__).resolve().parent.parent


def benchmarks(
    *args: str, timeout: float, module: str = "benchmarks"
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` (or another ``module``) in a child process, from the
    repository."""
    return subprocess.run(
        children.python("-m", module, *args),
        env=children.child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_quick_benchmark_prints_every_row_beside_its_baseline(tmp_path: Path) -> None:
    proc = benchmarks("--quick", "--dir", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0] == "durably benchmarks (python -m benchmarks)"
    assert "Python" in lines[1] and "SQLite" in lines[1] and "load average" in out
    header = next(line for line in lines if line.startswith("row "))
    for column in ("baseline", "durably", "vs base", "DBOS"):
        assert column in header
    pg = not pgcluster.missing_tools() or os.environ.get("DURABLY_REQUIRE_POSTGRES") == "1"
    expected = ["step-full", "step-normal", "step-sync-full", "step-sync-normal",
                "tp1-full-100", "tp10-full-1", "recovery-full", "recovery-full-10000",
                "replay-100", "replay-1000", "signal-full", "bytes-full"]  # fmt: skip
    if pg:
        expected += ["step-pg", "tp1-pg-100", "procs-pg-1", "procs-pg-4", "recovery-pg",
                     "recovery-pg-10000", "signal-pg", "bytes-pg"]  # fmt: skip
    rows = {line.split(" | ")[0].strip(): line.split(" | ") for line in lines if " | " in line}
    for name in expected:
        assert name in rows, f"row {name} missing from:\n{out}"
        baseline, durably_cell = rows[name][3].strip(), rows[name][4].strip()
        assert baseline != "-" and durably_cell != "-", rows[name]
    # --quick shrinks the 10,000-workflow recovery rows, and says so on the row.
    assert "300 killed wfs" in rows["recovery-full-10000"][1], rows["recovery-full-10000"]
    assert "(--quick: 10000 in a full run)" in rows["recovery-full-10000"][1]
    if importlib.util.find_spec("dbos") is not None:
        # DBOS runs the replay and recovery workloads too (--quick leaves out the big ones).
        for name in ("step-full", "replay-100", "recovery-full"):
            dbos_cell = rows[name][6].strip()
            assert dbos_cell != "-", f"DBOS is installed but its {name} cell is empty"
            assert float(dbos_cell.split()[0]) > 0, rows[name]
        assert "replay and recovery not measured" not in out
        assert "note: DBOS left out of --quick: " in out
    else:
        assert "DBOS column skipped" in out
    # The temp files are removed.
    assert not any(tmp_path.iterdir())


def test_an_unknown_row_name_is_refused_naming_the_rows() -> None:
    proc = benchmarks("--quick", "--rows", "no-such-row", timeout=120)
    assert proc.returncode == 2
    assert "no-such-row" in proc.stderr and "step-full" in proc.stderr


def test_the_latency_proxy_delays_each_round_trip_and_keeps_the_bytes_in_order() -> None:
    """``--rtt``'s proxy (benchmarks/latency.py) in front of a real echo server on
    127.0.0.1: every byte comes back, in order, and a round trip through it takes at
    least the delay asked for."""
    import socket
    import threading
    import time

    from benchmarks import latency

    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    with (
        latency.proxy("127.0.0.1", echo.getsockname()[1], rtt_ms=20) as port,
        socket.create_connection(("127.0.0.1", port)) as client,
    ):
        took = []
        for i in range(5):
            t0 = time.perf_counter()
            client.sendall(b"ping%d" % i)
            assert client.recv(64) == b"ping%d" % i
            took.append(time.perf_counter() - t0)
        assert min(took) >= 0.020, took
        sent = b"".join(b"%06d" % i for i in range(20_000))  # many chunks, sent at once
        client.sendall(sent)
        got = b""
        while len(got) < len(sent):
            got += client.recv(65536)
        assert got == sent
    echo.close()


def test_rtt_puts_the_proxy_between_the_postgres_rows_and_the_server() -> None:
    """``--rtt MS``: the PostgreSQL rows run through the proxy, and the note says the
    round trip measured through it."""
    if pgcluster.missing_tools() and os.environ.get("DURABLY_REQUIRE_POSTGRES") != "1":
        pytest.skip(f"PostgreSQL is missing: {', '.join(pgcluster.missing_tools())}")
    args = ("--quick", "--rows", "step-pg", "--no-dbos", "--rounds", "1", "--rtt", "5")
    proc = benchmarks(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    note = next(line for line in proc.stdout.splitlines() if "delaying proxy" in line)
    measured = float(note.split("every round trip ")[1].split(" ms")[0])
    assert measured >= 5.0, note
    row = next(line for line in proc.stdout.splitlines() if line.startswith("step-pg "))
    step_us = float(row.split(" | ")[4].split()[0])
    assert step_us >= 5000, row  # a step's commit is at least one round trip


def test_the_history_benchmark_prints_every_read_at_both_sizes() -> None:
    """``python -m benchmarks.history``: each read an operator makes, timed over N/10
    and N finished workflows beside a primary-key read, on SQLite and PostgreSQL."""
    pg = not pgcluster.missing_tools() or os.environ.get("DURABLY_REQUIRE_POSTGRES") == "1"
    args = ("--finished", "2000") if pg else ("--finished", "2000", "--no-postgres")
    proc = benchmarks(*args, timeout=300, module="benchmarks.history")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("\nread ")[1:]
    assert len(tables) == (2 if pg else 1), proc.stdout
    for table in tables:
        assert "200 ms" in table.splitlines()[0] and "2,000 ms" in table.splitlines()[0]
        rows = {ln.split(" | ")[0].strip(): ln.split(" | ") for ln in table.splitlines()[1:]}
        reads = ("primary-key read", "newest 50", "50 by id", "unfinished counts",
                 "counts by status", "the dashboard's look", "agent page's look",
                 "agent's whole journal")  # fmt: skip
        for read in reads:
            assert read in rows, f"{read} missing from:\n{table}"
            assert all(float(cell.rstrip("x")) > 0 for cell in rows[read][1:]), rows[read]
        assert rows["primary-key read"][3].strip() == "1.0"  # the baseline, against itself


def test_the_statements_benchmark_times_each_statement_of_a_step_and_a_workflow() -> None:
    """``python -m benchmarks.statements``: the statements a step and a 1-step workflow
    send, counted where the store executes them, beside the raw baseline's, and the WAL
    pages each writes."""
    args = ("--steps", "100", "--workflows", "20")
    proc = benchmarks(*args, timeout=300, module="benchmarks.statements")
    assert proc.returncode == 0, proc.stderr[-3000:]
    step, workflow, raw = proc.stdout.split("\n\n")[1:4]

    def counts(table: str) -> dict[str, float]:
        lines = table.splitlines()
        start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["statement"])
        rows = [line.split() for line in lines[start + 1 : -1]]
        return {" ".join(r[:-3]): float(r[-3]) for r in rows}

    # a step is one commit: BEGIN IMMEDIATE, the fence, the journal's upsert, COMMIT
    # (the workflow's start and finish are shared by its 100 steps)
    per_step = counts(step)
    for statement in ("BEGIN IMMEDIATE", "fence", "upsert_entry", "COMMIT"):
        assert round(per_step[statement]) == 1, step
    # a 1-step workflow is three: its start (row and claim), its step, its finish
    per_workflow = counts(workflow)
    for statement in ("COMMIT", "BEGIN IMMEDIATE"):
        assert round(per_workflow[statement], 1) == 3.0, workflow
    for statement in ("create_workflow", "insert_claim", "fence", "upsert_entry"):
        assert per_workflow[statement] == 1.0, workflow
    assert per_workflow["finish_workflow"] == 1.0, workflow
    assert "create_workflow" not in per_step  # the start's, shared by the steps: left out
    pages = float(step.split(" WAL pages a step")[0].rsplit("\n", 1)[1])
    assert 1 <= pages < 10, step  # the journal's row and its key, now and then a split
    loops = {line.split()[0]: line for line in raw.splitlines() if "BEGIN IMMEDIATE" in line}
    assert set(loops) == {"tight", "Python"}, raw
    for line in loops.values():
        assert "INSERT" in line and "COMMIT" in line, raw
    assert raw.count(" all ") == 2, raw


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_sync_steps_benchmark_prints_each_count_in_flight_beside_async_steps(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``python -m benchmarks.sync_steps``: sync against async steps, a row per count in
    flight, each a median of the rounds and the ratio of the two; on PostgreSQL in
    schemas of its own, dropped at the end."""
    args = ["--workflows", "12", "--steps", "3", "--rounds", "2", "--in-flight", "1", "4"]
    if backend == "postgres":
        args += ["--postgres", request.getfixturevalue("postgres_url")]
    else:
        args += ["--dir", str(tmp_path)]
    proc = benchmarks(*args, timeout=300, module="benchmarks.sync_steps")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "durably sync steps (python -m benchmarks.sync_steps)"
    assert ("PostgreSQL" if backend == "postgres" else "SQLite NORMAL") in lines[1]
    header = lines.index(next(line for line in lines if line.split()[:2] == ["in", "flight"]))
    rows = [line.split() for line in lines[header + 1 :]]
    assert [row[0] for row in rows] == ["1", "4"], proc.stdout
    for row in rows:  # "1  469 [443-601]  359 [345-363]  0.76x"
        assert len(row) == 6 and row[5].endswith("x") and float(row[5][:-1]) > 0, row
    assert proc.stderr.count("done") == 2
    assert all(len(line) <= 80 for line in lines), proc.stdout
    if backend == "postgres":
        import psycopg

        with psycopg.connect(args[-1], autocommit=True) as conn:
            left = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_sync_%'"
            ).fetchone()
        assert left == (0,)
    else:
        assert list(tmp_path.iterdir()) == []  # its temp dir removed
