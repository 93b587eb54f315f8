"""Retention: an engine that keeps finished workflows for a while, then prunes them.

``Engine(retention=timedelta(days=30))`` runs :func:`prune_loop` beside its
recovery loop. Each batch is one short transaction (``Store.prune``), so no
write lock is held for long; the loop yields between batches.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from durably import errors, loop_errors, operations

log = logging.getLogger("durably")

#: Workflows removed per transaction.
BATCH = 200


def interval(retention: datetime.timedelta) -> float:
    """Seconds between pruning passes: a tenth of the retention, between 50 ms and an hour."""
    return max(0.05, min(3600.0, retention.total_seconds() / 10))


async def prune_once(
    call: Callable[..., Awaitable[Any]],
    prune: Callable[..., list[str]],
    clock: Callable[[], float],
    retention: datetime.timedelta,
) -> int:
    """Prune every workflow finished longer ago than ``retention``, batch by batch."""
    total = 0
    while True:
        pruned: list[str] = await call(prune, clock() - retention.total_seconds(), None, BATCH)
        total += len(pruned)
        if len(pruned) < BATCH:
            return total
        await asyncio.sleep(0)  # let the workflows' commits in between batches


async def prune_loop(
    call: Callable[..., Awaitable[Any]],
    prune: Callable[..., list[str]],
    clock: Callable[[], float],
    retention: datetime.timedelta,
    stopping: asyncio.Event,
) -> None:
    """Prune, then wait :func:`interval`, until ``stopping`` is set or it is cancelled.

    An error other than the store's is logged (with its traceback once per kind) and
    the next pass waits at least a back-off (``loop_errors``).
    """
    unexpected = loop_errors.LoopErrors("the retention loop")
    while not stopping.is_set():
        pause = interval(retention)
        try:
            pruned = await prune_once(call, prune, clock, retention)
            if pruned:
                log.info("pruned %d finished workflow(s) older than %s", pruned, retention)
        except errors.StoreError as exc:
            log.warning("pruning failed: %s", exc)
        except Exception as exc:  # a driver's OSError, a bug: prune again, later
            pause = max(pause, unexpected.failed(exc))
        else:
            unexpected.succeeded()
        await operations.wait_event(stopping, pause)
