"""``python -m benchmarks``: what durably costs, each figure beside its baseline from the same run.

    python -m benchmarks [--quick] [--rounds N] [--rows NAME ...] [--postgres URL] [--no-dbos]
                         [--rtt MS]

One table: per-step latency (SQLite FULL, NORMAL, PostgreSQL) against one raw
commit; a sync ``def`` step against an async one on the same engine; workflow
throughput (1 and 10 steps, 1/10/100 in flight; 1, 2 and 4 worker processes on
one PostgreSQL database) against raw commits per second; recovery of 1,000 and
10,000 killed workflows against running as many fresh; replay per step against
reading the rows back; a signal's wake-up; journal bytes per step against the
result's own JSON; and DBOS Transact on the same workloads when ``dbos`` is
installed (its replay and recovery as benchmarks/dbos_workloads.py says). Rounds
are interleaved (every row once per round, baseline and durably back to back),
databases are warm (made once, reused by every round), and each cell is
``median [min-max]`` over the rounds. ``--rtt MS`` puts a proxy that delays every
packet (benchmarks/latency.py) between every PostgreSQL client and the server: the
rows then show what round trips cost where the server is across a network.

This is a benchmark, not a test: nothing asserts on speed. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import durably
from benchmarks import workloads
from durably.bench.report import PARK, cell, off_loop, ratio

REPO = Path(__file__).resolve().parent.parent

#: durably's PostgreSQL engines here use four store connections (the default is one:
#: see docs/decisions.md); the raw baseline uses one connection.
PG_OPTIONS = "?connections=4"
SIGNALS = 5  # wake-ups a signal row times each round; its figure is their median

# --- what is measured ---------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: a durably figure, its baseline, and DBOS's when measurable."""

    name: str  # for --rows
    label: str
    unit: str
    backend: str  # "full", "normal" or "pg": the durably engine (and raw baseline) it uses
    kind: str  # step, throughput, replay, signal, bytes, recovery
    params: tuple[int, ...] = ()
    baseline: str = ""  # what the baseline column is
    dbos: bool = False  # DBOS runs the same workload
    values: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    dbos_values: list[float] = field(default_factory=list)


@dataclass
class Sizes:
    steps: int
    totals: dict[int, int]  # in flight -> workflows per measurement
    replay: tuple[int, ...]
    recovery: int
    recovery_large: int  # the recovery-*-10000 rows: RECOVERY_LARGE, fewer in --quick
    rounds: int


#: The workflows of the ``recovery-*-10000`` rows (the name stays when --quick shrinks it).
RECOVERY_LARGE = 10_000

FULL = Sizes(2000, {1: 200, 10: 500, 100: 2000}, (1000, 10000), 1000, RECOVERY_LARGE, 5)
QUICK = Sizes(30, {1: 10, 10: 20, 100: 100}, (100, 1000), 100, 300, 2)
#: Rows whose DBOS cell --quick leaves out (name prefixes): DBOS runs 10-step workflows
#: at ~20/s here, a first pass of 1,000 steps takes it seconds, and each of its recovery
#: rows is two DBOS processes (the killed one and the one that recovers) of ~2 s each.
QUICK_WITHOUT_DBOS = ("tp10-", "replay-1000", "recovery-pg", f"recovery-full-{RECOVERY_LARGE}")


def make_rows(sizes: Sizes) -> list[Row]:
    rows: list[Row] = []
    names = {"full": "SQLite FULL", "normal": "SQLite NORMAL", "pg": "PostgreSQL"}
    for b in ("full", "normal", "pg"):
        rows.append(
            Row(f"step-{b}", f"async step, {names[b]}", "us", b, "step", (sizes.steps,),
                "raw commit us", dbos=b != "normal")
        )  # fmt: skip
    for b in ("full", "normal"):
        rows.append(
            Row(f"step-sync-{b}", f"sync def step, {names[b]}", "us", b, "sync",
                (sizes.steps,), "async step us")
        )  # fmt: skip
    for b in ("full", "pg"):
        for steps in (1, 10):
            for k in (1, 10, 100):
                rows.append(
                    Row(f"tp{steps}-{b}-{k}", f"{steps}-step wf/s, {k} in flight, {names[b]}",
                        "wf/s", b, "throughput", (steps, k, sizes.totals[k]),
                        "raw commits/s / steps", dbos=True)
                )  # fmt: skip
    for procs in (1, 2, 4):
        rows.append(
            Row(f"procs-pg-{procs}", f"1-step wf/s, {procs} worker process(es) x 100 in flight, "
                "PostgreSQL", "wf/s", "pg", "processes", (procs, 100, sizes.totals[100]),
                "raw commits/s")
        )  # fmt: skip
    for b in ("full", "pg"):
        rows.append(
            Row(f"recovery-{b}", f"{sizes.recovery} killed wfs done after restart, {names[b]}",
                "s", b, "recovery", (sizes.recovery,), "as many fresh, s", dbos=True)
        )  # fmt: skip
    for b in ("full", "pg"):
        n = sizes.recovery_large
        shrunk = "" if n == RECOVERY_LARGE else f" (--quick: {RECOVERY_LARGE} in a full run)"
        rows.append(
            Row(f"recovery-{b}-{RECOVERY_LARGE}",
                f"{n} killed wfs done after restart, {names[b]}{shrunk}", "s", b, "recovery",
                (n,), "as many fresh, s", dbos=True)
        )  # fmt: skip
    for n in sizes.replay:
        rows.append(
            Row(f"replay-{n}", f"replay per step, {n} steps, SQLite FULL", "us", "full",
                "replay", (n,), "raw read+decode us/row", dbos=True)
        )  # fmt: skip
    for b in ("full", "pg"):
        rows.append(
            Row(f"signal-{b}", f"signal wake-up, {names[b]}", "us", b, "signal",
                (SIGNALS,), "raw commit us", dbos=True)
        )  # fmt: skip
    for b in ("full", "pg"):
        rows.append(
            Row(f"bytes-{b}", f"journal bytes per step, {names[b]}", "B", b, "bytes",
                (sizes.steps,), "result JSON bytes", dbos=b == "full")
        )  # fmt: skip
    return rows


# --- the run ------------------------------------------------------------------------------


class Backends:
    """The warm databases of one run: an open engine and a raw baseline per backend."""

    def __init__(self, workdir: str, pg_url: Callable[[str], str] | None) -> None:
        self.workdir = workdir
        self.pg_url = pg_url
        self.engines: dict[str, durably.Engine] = {}
        self.urls: dict[str, str] = {}
        self.raw: dict[str, workloads.RawSqlite | workloads.RawPostgres] = {}
        self._fresh = 0

    def fresh_url(self, backend: str, name: str) -> str:
        """A database nothing has used (for recovery, whose ids repeat each round)."""
        self._fresh += 1
        if backend == "pg":
            assert self.pg_url is not None
            return self.pg_url(f"{name}_{self._fresh}") + PG_OPTIONS
        mode = "full" if backend == "full" else "normal"
        return f"sqlite:///{self.workdir}/{name}-{self._fresh}.db?synchronous={mode}"

    async def open(self, backends: set[str]) -> None:
        for b in sorted(backends):
            if b == "pg":
                assert self.pg_url is not None
                url = self.pg_url("bench_durably") + PG_OPTIONS
                self.raw[b] = workloads.RawPostgres(self.pg_url("bench_raw"))
            else:
                url = f"sqlite:///{self.workdir}/durably-{b}.db?synchronous={b}"
                self.raw[b] = workloads.RawSqlite(f"{self.workdir}/raw-{b}.db", b)
            # parks after 50 ms, not a second: the replay and signal rows wait for each
            engine = durably.Engine(url, poll_interval=60.0, hold_seconds=PARK)
            await engine.open()
            self.engines[b], self.urls[b] = engine, url
            await workloads.step_us(engine, 20)  # warm-up: threads, statements, the WAL

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()
        for raw in self.raw.values():
            raw.close()


async def measure(row: Row, be: Backends) -> tuple[float, float]:
    """One round of one row: (baseline, durably).

    The raw baselines run in a worker thread: blocking the engines' event loop for a
    second would make them warn, and the engines are idle meanwhile either way.
    """
    engine, raw = be.engines[row.backend], be.raw[row.backend]
    if row.kind == "step":
        base = await off_loop(raw.commit_us, row.params[0])
        return base, await workloads.step_us(engine, row.params[0])
    if row.kind == "sync":  # against the async step of the same engine, back to back
        base = await workloads.step_us(engine, row.params[0])
        return base, await workloads.sync_step_us(engine, row.params[0])
    if row.kind == "throughput":
        steps = row.params[0]
        base = 1e6 / await off_loop(raw.commit_us, 200) / steps
        return base, await workloads.throughput(engine, *row.params)
    if row.kind == "processes":
        base = 1e6 / await off_loop(raw.commit_us, 200)
        return base, await workloads.processes_throughput(be.urls[row.backend], *row.params)
    if row.kind == "replay":
        base = await off_loop(raw.read_us, row.params[0])
        return base, await workloads.replay_us(engine, row.params[0])
    if row.kind == "signal":
        base = await off_loop(raw.commit_us, 50)
        return base, await workloads.signal_us(engine, row.params[0])
    if row.kind == "bytes":
        base = float(len(json.dumps({**workloads.PAYLOAD, "n": 1}, separators=(",", ":"))))
        return base, await workloads.journal_bytes_per_step(
            engine, be.urls[row.backend], row.params[0]
        )
    if row.kind == "recovery":
        n = row.params[0]
        fresh = await workloads.fresh_seconds(be.fresh_url(row.backend, "fresh"), n)
        return fresh, await workloads.recovery_seconds(be.fresh_url(row.backend, "recover"), n)
    raise ValueError(f"unknown row kind {row.kind!r}")


def dbos_round(rows: list[Row], be: Backends, round_no: int) -> dict[str, float]:
    """One round of every DBOS row, in a child process (DBOS state is process-global).

    The rows of a backend share one database a round, except a recovery row: its
    database is its own, since DBOS's launch on it is what is timed.
    """
    by_db: dict[str, dict[str, list[Any]]] = {}
    for row in rows:
        if not row.dbos:
            continue
        db = f"dbos_{round_no}"
        if row.kind == "recovery":
            db = f"dbos_{row.name.replace('-', '_')}_{round_no}"
        if row.backend == "pg":
            assert be.pg_url is not None
            url = be.pg_url(f"bench_{db}")
        else:
            url = f"sqlite:///{be.workdir}/{db}.db"
        spec: list[Any] = [row.kind, *row.params]
        if row.kind == "throughput":  # DBOS is ~20x slower here: a tenth of the workflows
            steps, in_flight, total = row.params
            spec = [row.kind, steps, in_flight, max(in_flight, total // 10)]
        if row.kind == "bytes":
            spec.append(url.removeprefix("sqlite:///"))
        by_db.setdefault(url, {})[row.name] = spec
    if not by_db:
        return {}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.dbos_workloads",
         json.dumps({"databases": list(by_db.items())})],
        capture_output=True, text=True, timeout=3600, check=False, cwd=REPO,
    )  # fmt: skip
    if done.returncode != 0:
        print(f"note: the DBOS round failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return {}
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def run_rounds(rows: list[Row], be: Backends, rounds: int, with_dbos: bool) -> None:
    await be.open({r.backend for r in rows})
    try:
        for round_no in range(1, rounds + 1):
            for row in rows:
                base, value = await measure(row, be)
                row.base.append(base)
                row.values.append(value)
            if with_dbos:
                for name, value in (
                    await asyncio.to_thread(dbos_round, rows, be, round_no)
                ).items():
                    next(r for r in rows if r.name == name).dbos_values.append(value)
            print(f"round {round_no}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        await be.close()


# --- PostgreSQL -----------------------------------------------------------------------------


@contextlib.contextmanager
def postgres(url: str | None) -> Iterator[tuple[Callable[[str], str] | None, str]]:
    """(make a database by name -> its URL, a note) for --postgres URL or a throwaway cluster."""
    if importlib.util.find_spec("psycopg") is None:
        yield (
            None,
            "PostgreSQL rows skipped: psycopg is not installed (pip install durably[postgres])",
        )
        return
    import psycopg

    if url is not None:
        admin = psycopg.connect(url, autocommit=True)

        def make(name: str) -> str:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
            return url.rsplit("/", 1)[0] + "/" + name

        try:
            yield make, f"PostgreSQL: {url} (as given)"
        finally:
            admin.close()
        return
    sys.path.insert(0, str(REPO))
    from tests import pgcluster

    missing = pgcluster.missing_tools()
    if missing:
        yield None, f"PostgreSQL rows skipped: missing {', '.join(missing)}"
        return
    cluster = pgcluster.PgCluster.start()
    try:
        # The test cluster turns durability off; a benchmark of commits needs it on.
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            cluster.execute(f"ALTER SYSTEM SET {setting} = on")
        cluster.execute("SELECT pg_reload_conf()")
        version = cluster.admin().execute("SHOW server_version").fetchone()
        made: set[str] = set()

        def make(name: str) -> str:
            if name not in made:
                cluster.execute(f"CREATE DATABASE {name}")
                made.add(name)
            return cluster.url(name)

        note = (
            f"PostgreSQL {version[0] if version else '?'}: throwaway local cluster "
            "(127.0.0.1 TCP, fsync and synchronous_commit on)"
        )
        yield make, note
    finally:
        cluster.stop()


@contextlib.contextmanager
def delayed(
    pg: contextlib.AbstractContextManager[tuple[Callable[[str], str] | None, str]], rtt_ms: float
) -> Iterator[tuple[Callable[[str], str] | None, str]]:
    """``pg``'s databases reached through :mod:`benchmarks.latency`, which adds ``rtt_ms``
    to every round trip; the note says the round trip measured through it."""
    import psycopg

    from benchmarks import latency

    with contextlib.ExitStack() as stack:
        make, note = stack.enter_context(pg)
        if make is None:
            yield make, note
            return
        ports: dict[tuple[str, int], int] = {}

        def through(name: str) -> str:
            url = urllib.parse.urlsplit(make(name))
            server = (url.hostname or "127.0.0.1", url.port or 5432)
            if server not in ports:
                ports[server] = stack.enter_context(latency.proxy(*server, rtt_ms))
            userinfo, at, _ = url.netloc.rpartition("@")  # the user and password, kept
            netloc = f"{userinfo}{at}127.0.0.1:{ports[server]}"
            return urllib.parse.urlunsplit(url._replace(netloc=netloc))

        probe = through("durably_bench_rtt")
        with psycopg.connect(probe, autocommit=True) as conn:
            took = []
            for _ in range(21):
                t0 = time.perf_counter()
                conn.execute("SELECT 1").fetchone()
                took.append((time.perf_counter() - t0) * 1000)
        got = statistics.median(took)
        proxied = f"every round trip {got:.2f} ms through a delaying proxy (--rtt {rtt_ms:g})"
        yield through, f"{note}; {proxied}"


# --- the table ------------------------------------------------------------------------------


def lead(row: Row) -> str:
    """How many times better durably is than DBOS on this row (wf/s: higher is better)."""
    if row.unit == "wf/s":
        return ratio(row.values, row.dbos_values)
    return ratio(row.dbos_values, row.values)


def print_table(rows: list[Row], notes: list[str], header: list[str]) -> None:
    for line in header:
        print(line)
    print()
    cols = ("row", "what", "unit", "baseline", "durably", "vs base", "DBOS", "durably lead")
    table = [
        (r.name, r.label, r.unit, cell(r.base), cell(r.values), ratio(r.values, r.base),
         cell(r.dbos_values), lead(r))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for t in table:
        print(" | ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)))
    print()
    print("baselines: " + "; ".join(sorted({f"{r.kind}: {r.baseline}" for r in rows})))
    print("cells: median [min-max] over rounds; 'vs base' is durably / baseline (medians);")
    print("'durably lead' is how many times better durably's median is than DBOS's (> 1: ahead)")
    for note in notes:
        print(f"note: {note}")


def machine_header(rounds: int, load_before: str) -> list[str]:
    versions = [f"durably {durably.__version__}", f"Python {platform.python_version()}",
                f"SQLite {sqlite3.sqlite_version}"]  # fmt: skip
    for mod in ("psycopg", "dbos"):
        if importlib.util.find_spec(mod) is not None:
            from importlib import metadata

            with contextlib.suppress(metadata.PackageNotFoundError):
                versions.append(f"{mod} {metadata.version(mod)}")
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        "durably benchmarks (python -m benchmarks)",
        ", ".join(versions),
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} CPUs",
        f"load average before/after: {load_before} / {load} (other processes add noise)",
        f"{rounds} interleaved rounds after one warm-up workflow per engine",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds (< 60 s)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5, --quick 2)")
    parser.add_argument("--rows", nargs="+", metavar="NAME", help="only these rows (prefixes)")
    parser.add_argument("--postgres", metavar="URL", help="an existing server (a superuser URL)")
    parser.add_argument("--no-dbos", action="store_true", help="leave out the DBOS column")
    parser.add_argument("--dir", help="parent of the temp dir for SQLite files")
    parser.add_argument(
        "--rtt",
        type=float,
        metavar="MS",
        help="add MS to every PostgreSQL round trip (a proxy): a server across a network",
    )
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or sizes.rounds
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    rows = make_rows(sizes)
    if args.quick:  # keep --quick under a minute: DBOS takes seconds on these
        for r in rows:
            r.dbos = r.dbos and not r.name.startswith(QUICK_WITHOUT_DBOS)
    if args.rows:
        unknown = [n for n in args.rows if not any(r.name.startswith(n) for r in rows)]
        if unknown:
            parser.error(
                f"no row named {', '.join(unknown)}; rows: {' '.join(r.name for r in rows)}"
            )
        rows = [r for r in rows if any(r.name.startswith(n) for n in args.rows)]
    notes: list[str] = []
    with_dbos = not args.no_dbos and importlib.util.find_spec("dbos") is not None
    if not args.no_dbos and not with_dbos:
        notes.append("DBOS column skipped: dbos is not installed (pip install 'durably[bench]')")
    if with_dbos:
        notes.append(
            "DBOS replay: the recorded workflow forked past its last step (DBOS.fork_workflow"
            "), which re-runs it from the top on its recorded outputs, as recovery does"
        )
        notes.append(
            "DBOS recovery: a child running DBOS SIGKILLed with the workflows hung mid-run; "
            "timed from DBOS() and launch() in the next process until all are SUCCESS"
        )
        notes.append("DBOS signal: sent 0.2 s after start (DBOS shows no waiting status)")
        notes.append("DBOS throughput: a tenth as many workflows per measurement (>= 1 per lane)")
        if args.quick:
            notes.append(f"DBOS left out of --quick: {', '.join(QUICK_WITHOUT_DBOS)}")
    if args.quick and any(r.name.endswith(f"-{RECOVERY_LARGE}") for r in rows):
        notes.append(
            f"--quick: the recovery-*-{RECOVERY_LARGE} rows recover {QUICK.recovery_large} "
            f"workflows, not {RECOVERY_LARGE}"
        )

    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="durably-bench-", dir=parent)
    started = time.perf_counter()
    try:
        wants_pg = any(r.backend == "pg" for r in rows)
        pg = postgres(args.postgres) if wants_pg else contextlib.nullcontext((None, ""))
        if wants_pg and args.rtt:
            pg = delayed(pg, args.rtt)
        with pg as (mk, note):
            if wants_pg:
                notes.append(note)
            if mk is None:
                rows = [r for r in rows if r.backend != "pg"]
            be = Backends(workdir, mk)
            asyncio.run(run_rounds(rows, be, rounds, with_dbos))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    header = machine_header(rounds, load_before)
    header.append(
        f"SQLite files in {parent} (removed); {time.perf_counter() - started:.0f} s total"
    )
    print_table(rows, notes, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
