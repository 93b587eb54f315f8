"""``handle.result()`` of a workflow that ended in this engine returns what its run
committed, without reading the workflow's row back; any other reads the row."""

from __future__ import annotations

from typing import Any

import pytest

import durably


@durably.step
async def double(x: int) -> int:
    return 2 * x


@durably.workflow(name="result-doubled")
async def doubled(x: int) -> int:
    return await double(x)


@durably.workflow(name="result-fails")
async def fails() -> None:
    await double(1)
    raise ValueError("no refund for you")


def count_reads(engine: durably.Engine) -> list[str]:
    """Record every ``get_workflow`` the engine's store answers (the store runs as is)."""
    store: Any = engine._store.store
    reads: list[str] = []
    real = store.get_workflow

    def get_workflow(workflow_id: str) -> Any:
        reads.append(workflow_id)
        return real(workflow_id)

    store.get_workflow = get_workflow
    return reads


async def test_a_result_of_a_run_here_is_what_it_committed_without_a_read(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        reads = count_reads(engine)
        handle = await engine.start(doubled, 21)
        assert await handle.result(timeout=30) == 42
        failing = await engine.start(fails)
        with pytest.raises(ValueError, match="no refund for you"):
            await failing.result(timeout=30)
        assert reads == []
        # what it returned is what was stored
        info = await handle.info()
        assert (info.status, info.output) == ("completed", "42")
        assert (await failing.info()).status == "failed"


async def test_a_result_of_a_workflow_that_ended_elsewhere_reads_the_row(store_url: str) -> None:
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(doubled, 4)
        assert await handle.result(timeout=30) == 8
    async with durably.Engine(store_url) as engine:  # a new engine: nothing ran here
        reads = count_reads(engine)
        assert await engine.handle(handle.workflow_id).result(timeout=30) == 8
        assert reads == [handle.workflow_id]
