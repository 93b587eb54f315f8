"""``durably bench``'s rows, its interleaved rounds, and the table or JSON it prints."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import platform
import sqlite3
import statistics
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import durably
from durably.bench import processes, recovery, scratch, workloads


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each row does a round, and how many rounds."""

    steps: int  # steps of the one workflow the step rows time
    totals: dict[int, int]  # in flight -> workflows a throughput row runs
    replay: int  # steps of the replayed workflow
    signals: int  # wake-ups a signal row times (each waits for its run to park: PARK)
    recovery: int  # workflows a killed process leaves behind
    procs: int  # workflows each worker process of a processes row runs (100 in flight)
    rounds: int


DEFAULT = Sizes(1000, {1: 300, 10: 1000, 100: 3000}, 1000, 5, 1000, 1500, 3)
QUICK = Sizes(50, {1: 20, 10: 50, 100: 200}, 100, 2, 100, 100, 2)

#: The worker processes the processes rows start (each beside one process).
PROCESSES = (2, 4)

#: The engine's ``hold_seconds``: how long a blocked run stays before it parks.
PARK = 0.05

Measure = Callable[[durably.Engine, scratch.Scratch], Awaitable[tuple[float, float]]]


@dataclasses.dataclass
class Row:
    """One line of the table: what it times, its baseline, and the figures of each round."""

    name: str
    unit: str
    base_unit: str
    legend: str  # what the row and its baseline are, for the lines under the table
    measure: Measure  # one round: (baseline, durably)
    base: list[float] = dataclasses.field(default_factory=list)
    values: list[float] = dataclasses.field(default_factory=list)


def make_rows(sizes: Sizes) -> list[Row]:
    """Every row, in the table's order."""

    async def step(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
        base = await off_loop(place.raw.commit_us, 200)
        return base, await workloads.step_us(engine, sizes.steps)

    async def sync_step(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
        base = await workloads.step_us(engine, sizes.steps)  # the async step, back to back
        return base, await workloads.sync_step_us(engine, sizes.steps)

    def throughput(in_flight: int) -> Measure:
        async def measure(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
            base = 1e6 / await off_loop(place.raw.commit_us, 200)
            total = sizes.totals[in_flight]
            return base, await workloads.throughput(engine, 1, in_flight, total)

        return measure

    async def replay(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
        if place.raw.seq < sizes.replay:  # as many raw rows as recorded steps to read back
            await off_loop(place.raw.commit_us, sizes.replay - place.raw.seq)
        base = await off_loop(place.raw.read_us, sizes.replay)
        return base, await workloads.replay_us(engine, sizes.replay)

    rounds = itertools.count(1)

    async def recover(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
        n, at = sizes.recovery, next(rounds)  # each on databases of its own: the ids repeat
        base = await recovery.fresh_seconds(place.another(f"fresh{at}"), n)
        return base, await recovery.recovery_seconds(place.another(f"recover{at}"), n)

    async def signal(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
        base = await off_loop(place.raw.commit_us, 50)
        return base, await workloads.signal_us(engine, sizes.signals)

    procs_url: list[str] = []  # one scratch database for every processes row, made once

    def workers(n: int) -> Measure:
        turns = itertools.count()

        async def measure(engine: durably.Engine, place: scratch.Scratch) -> tuple[float, float]:
            if not procs_url:
                procs_url.append(place.another("procs"))
            url, total = procs_url[0], sizes.procs
            # One process and n in turn, each first every other round: the database grows
            # by every run, and the one after would always meet the larger one.
            order = (1, n) if next(turns) % 2 == 0 else (n, 1)
            found = {k: await processes.processes_throughput(url, k, 100, total) for k in order}
            return found[1], found[n]

        return measure

    step_legend = f"us per async step, {sizes.steps} in a workflow; base: a raw commit"
    sync_legend = "us per def step; base: the async step of the same round"
    rows = [
        Row("step", "us", "us", step_legend, step),
        Row("step-sync", "us", "us", sync_legend, sync_step),
    ]
    for k in sorted(sizes.totals):
        legend = f"1-step workflows/s, {k} in flight; base: raw commits/s, one at a time"
        rows.append(Row(f"tp1-{k}", "wf/s", "commit/s", legend, throughput(k)))
    rows += [
        Row("replay", "us", "us", f"us a replayed step ({sizes.replay}), its journal read before; "
            "base: read+decode", replay),
        Row("signal", "us", "us", "us from send_signal to the parked workflow woken; base: a raw "
            "commit", signal),
        Row("recovery", "s", "s", f"s until {sizes.recovery} killed workflows are done; base: "
            f"{sizes.recovery} fresh ones", recover),
    ]  # fmt: skip
    for n in PROCESSES:
        legend = f"1-step wf/s, {n} worker processes x 100 in flight; base: 1 process"
        rows.append(Row(f"procs-{n}", "wf/s", "wf/s", legend, workers(n)))
    return rows


def select(rows: list[Row], wanted: list[str]) -> list[Row]:
    """The rows named in ``wanted``, in the table's order: a name takes its row, anything
    else the rows it starts (``tp1`` takes the three throughput rows); all rows when
    ``wanted`` is empty. ValueError names one that takes no row."""
    if not wanted:
        return rows
    names = [row.name for row in rows]
    taken: set[str] = set()
    for want in wanted:
        found = [want] if want in names else [n for n in names if n.startswith(want)]
        if not found:
            raise ValueError(f"no row named {want!r}: the rows are {', '.join(names)}")
        taken.update(found)
    return [row for row in rows if row.name in taken]


async def off_loop(fn: Callable[..., float], *args: Any) -> float:
    """``fn(*args)`` on a worker thread (a raw baseline blocks: off the engine's loop). A
    cancel (Ctrl-C) waits for it to end: the baseline's connection is closed next, and
    SQLite's, closed under a statement still running on it, crashes the process."""
    running = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait({running})
        raise


@dataclasses.dataclass
class Report:
    """A finished run: where it measured, on what, and every row's figures."""

    database: str  # the URL given (its password hidden)
    setting: str
    where: str
    rounds: int
    load_before: float | None  # the 1-minute load average (None where there is none)
    load_after: float | None
    rows: list[Row]


async def run(
    url: str,
    sizes: Sizes,
    rows: list[Row],
    progress: Callable[[str], None],
    warn: Callable[[str], None],
) -> Report:
    """Run ``rows`` in ``sizes.rounds`` interleaved rounds (each row's baseline, then
    durably, back to back) on scratch databases beside ``url``'s; ``progress`` hears
    how it goes, ``warn`` what could not be removed at the end."""
    load_before = _load()
    with scratch.scratch(url, warn) as place:
        progress(f"measuring in {place.where} (removed at the end)")
        # A run parks 50 ms after it blocks, not a second: the signal and replay rows
        # wait for each park (the wake-up from it is timed the same either way).
        async with durably.Engine(place.url, poll_interval=60.0, hold_seconds=PARK) as engine:
            await workloads.step_us(engine, 20)  # warm-up: threads, statements, the file
            if any(row.name in ("replay", "signal") for row in rows):
                # and a wake-up's statements: PostgreSQL plans a statement's first five
                # runs on a connection each (a worker pays that once, not per wake-up)
                await workloads.signal_us(engine, 6)
            for round_no in range(1, sizes.rounds + 1):
                for row in rows:
                    base, value = await row.measure(engine, place)
                    row.base.append(base)
                    row.values.append(value)
                progress(f"round {round_no}/{sizes.rounds} done")
    return Report(place.shown, place.setting, place.where, sizes.rounds, load_before, _load(), rows)


# --- the table -------------------------------------------------------------------------------


def cell(values: list[float]) -> str:
    """``median [min-max]``, with as many decimals as the median's size calls for."""
    if not values:
        return "-"
    med, lo, hi = statistics.median(values), min(values), max(values)
    digits = 0 if med >= 100 else 1 if med >= 1 else 3
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def ratio(values: list[float], base: list[float]) -> str:
    """The medians' ratio, ``values / base``."""
    if not values or not base or statistics.median(base) == 0:
        return "-"
    return f"{statistics.median(values) / statistics.median(base):.2f}x"


def _load() -> float | None:
    """The 1-minute load average, where the system keeps one (not on Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _shown(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def versions() -> str:
    """durably's, Python's and the databases' drivers' versions."""
    found = [
        f"durably {durably.__version__}",
        f"Python {platform.python_version()}",
        f"SQLite {sqlite3.sqlite_version}",
    ]
    with contextlib.suppress(metadata.PackageNotFoundError):
        found.append(f"psycopg {metadata.version('psycopg')}")
    return ", ".join(found)


def table(report: Report) -> list[str]:
    """The report as lines of at most 80 columns (the header's paths aside)."""
    lines = [
        f"durably bench: {report.database} ({report.setting})",
        f"measured in {report.where}, removed after",
        versions(),
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{_shown(report.load_before)} before, {_shown(report.load_after)} after (1 minute)",
        "",
    ]
    cols = ("row", "durably", "baseline", "ratio")
    body = [
        (r.name, f"{cell(r.values)} {r.unit}", f"{cell(r.base)} {r.base_unit}",
         ratio(r.values, r.base))
        for r in report.rows
    ]  # fmt: skip
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip() for b in body]
    lines.append("")
    name_width = max(len(r.name) for r in report.rows)
    lines += [f"{r.name.ljust(name_width)}  {r.legend}" for r in report.rows]
    lines.append(
        f"cells: median [min-max] over {report.rounds} interleaved rounds; "
        "ratio: durably / baseline"
    )
    return lines


def as_json(report: Report) -> dict[str, Any]:
    """The report as one JSON-ready object (for ``--json``)."""

    def stats(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    return {
        "database": report.database,
        "setting": report.setting,
        "measured_in": report.where,
        "rounds": report.rounds,
        "versions": versions(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": {"before": report.load_before, "after": report.load_after},
        "rows": [
            {
                "row": r.name,
                "unit": r.unit,
                "baseline_unit": r.base_unit,
                "legend": r.legend,
                "durably": stats(r.values),
                "baseline": stats(r.base),
                "ratio": statistics.median(r.values) / statistics.median(r.base),
            }
            for r in report.rows
        ],
    }
