"""The same workloads on DBOS Transact, for the DBOS column of ``python -m benchmarks``.

DBOS keeps process-global state (one ``DBOS`` instance, a launched executor),
so each round runs here in a child process:

    python -m benchmarks.dbos_workloads SPEC_JSON  ->  one JSON object on stdout

SPEC_JSON names the system database URLs and the rows to measure; the answer
maps each row name to its figure (same units as the durably column). Rows DBOS
cannot be measured on here are left out and the table says so.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from typing import Any

from dbos import DBOS, DBOSConfig

PAYLOAD = {"ok": True, "n": 0, "text": "a small result"}
_spans: list[tuple[float, float]] = []
_seen: list[float] = []


@DBOS.step()
async def dbos_step(i: int) -> dict[str, Any]:
    return {**PAYLOAD, "n": i}


@DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos ships no types for it
async def dbos_steps(steps: int) -> int:
    t0 = time.perf_counter()
    for i in range(steps):
        await dbos_step(i)
    _spans.append((t0, time.perf_counter()))
    return steps


@DBOS.workflow()  # type: ignore[untyped-decorator]  # dbos ships no types for it
async def dbos_signal() -> None:
    await DBOS.recv_async("go", timeout_seconds=60)
    _seen.append(time.perf_counter())


async def step_us(steps: int) -> float:
    _spans.clear()
    handle = await DBOS.start_workflow_async(dbos_steps, steps)
    await handle.get_result()
    ((t0, t1),) = _spans
    return (t1 - t0) / steps * 1e6


async def throughput(steps: int, in_flight: int, total: int) -> float:
    left = [total]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            handle = await DBOS.start_workflow_async(dbos_steps, steps)
            await handle.get_result()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return total / (time.perf_counter() - t0)


async def signal_us() -> float:
    _seen.clear()
    handle = await DBOS.start_workflow_async(dbos_signal)
    await asyncio.sleep(0.2)  # DBOS exposes no "is waiting" status to wait on; see docs
    t0 = time.perf_counter()
    await DBOS.send_async(handle.workflow_id, "x", "go")
    await handle.get_result()
    return (_seen[-1] - t0) * 1e6


def _bytes(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        row = conn.execute(
            "SELECT sum(pgsize) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = 'operation_outputs')"
        ).fetchone()
        return int(row[0] or 0)
    finally:
        conn.close()


async def measure(rows: dict[str, list[Any]]) -> dict[str, float]:
    """Run each row's workload once: ``{row: [kind, *parameters]}`` -> ``{row: figure}``."""
    out: dict[str, float] = {}
    await step_us(10)  # warm-up
    for name, (kind, *params) in rows.items():
        if kind == "step":
            out[name] = await step_us(params[0])
        elif kind == "throughput":
            out[name] = await throughput(*params)
        elif kind == "signal":
            out[name] = await signal_us()
        elif kind == "bytes":
            path = params[1]
            before = _bytes(path)
            await step_us(params[0])
            out[name] = (_bytes(path) - before) / params[0]
    return out


def main(spec: dict[str, Any]) -> dict[str, float]:
    """For each system database in ``spec``: launch DBOS on it, measure its rows, destroy it."""
    result: dict[str, float] = {}
    for url, rows in spec["databases"]:
        config: DBOSConfig = {
            "name": "durably-bench",
            "system_database_url": url,
            "log_level": "WARNING",
            "run_admin_server": False,
        }
        DBOS(config=config)
        DBOS.launch()
        try:
            result.update(asyncio.run(measure(rows)))
        finally:
            DBOS.destroy(destroy_registry=False)
    return result


if __name__ == "__main__":
    tempfile.tempdir = None
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
