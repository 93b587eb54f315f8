"""Many signals from two engines at once, to workflows that park, wake and park again.

Each engine that sends a signal to a parked workflow it can run takes the workflow in
the signal's own commit (on PostgreSQL one statement counts the signal and claims the
row, ``keep_and_claim_signal``); the other engine's sends meanwhile meet a workflow
running elsewhere, or held in memory by a run here. Whatever the interleaving, every
signal sent once is received once, duplicates of a key are refused and keep nothing,
and a workflow receives its signals in the order they were numbered, which is the
order each sender sent its own. On PostgreSQL no two transactions deadlock: each
engine's group commit of sends takes the workflows' rows in id order
(``base.lock_order``); before, a storm like this one met ten or more deadlocks, each a
second's wait for the server to undo one side, whose caller got ``DatabaseLocked``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import psycopg

import durably
from tests.test_pg_connections import sessions

#: Workflows, and signals each of the two engines sends to each of them.
WORKFLOWS = 8
PER_SENDER = 4


@durably.workflow(name="storm-collector")
async def collector(count: int) -> list[Any]:
    """Receive ``count`` signals named ``s``, one at a time; what each carried, in order."""
    got = []
    for _ in range(count):
        got.append(await durably.wait_for_signal("s"))
    return got


async def _send_all(engine: durably.Engine, sender: str, wid: str) -> list[bool]:
    """``PER_SENDER`` signals in turn, each with its own key, then the first key again."""
    sent = []
    for i in range(PER_SENDER):
        payload = f"{sender}-{i}"
        sent.append(await engine.send_signal(wid, "s", payload, idempotency_key=payload))
        await asyncio.sleep(0.002 * (i % 3))  # some sends meet a parked run, some a live one
    sent.append(await engine.send_signal(wid, "s", "again", idempotency_key=f"{sender}-0"))
    return sent


async def test_signals_from_two_engines_at_once_are_each_received_once_in_order(
    store_url: str,
) -> None:
    postgres = store_url.startswith("postgresql")
    deadlocks_before = _deadlocks(store_url) if postgres else 0
    options: dict[str, Any] = {"hold_seconds": 0.01, "poll_interval": 0.05}
    async with durably.Engine(store_url, **options) as a, durably.Engine(
        store_url, **options
    ) as b:  # fmt: skip
        handles = [
            await a.start(collector, 2 * PER_SENDER, workflow_id=f"storm-{n}")
            for n in range(WORKFLOWS)
        ]
        sends = [
            _send_all(engine, sender, h.workflow_id)
            for h in handles
            for engine, sender in ((a, "a"), (b, "b"))
        ]
        results = await asyncio.wait_for(asyncio.gather(*sends), timeout=60)
        assert all(r == [True] * PER_SENDER + [False] for r in results), results
        for h in handles:
            got = await asyncio.wait_for(h.result(), timeout=60)
            for sender in "ab":  # each sender's own signals, in the order it sent them
                assert [p for p in got if p.startswith(sender)] == [
                    f"{sender}-{i}" for i in range(PER_SENDER)
                ], got
            kept = await a.signals(h.workflow_id)
            in_order = sorted(kept, key=lambda s: s["num"])
            assert [json.loads(s["payload"]) for s in in_order] == got
            assert all(s["consumed_seq"] is not None for s in kept), kept
    if postgres:  # counted by each session, in full once it has ended
        deadline = time.monotonic() + 30
        while sessions(store_url):
            assert time.monotonic() < deadline, "a session outlived its engine"
            await asyncio.sleep(0.01)
        assert _deadlocks(store_url) == deadlocks_before


def _deadlocks(url: str) -> int:
    """The deadlocks the server has ended in this database so far."""
    with psycopg.connect(url, autocommit=True) as observer:
        row = observer.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])
