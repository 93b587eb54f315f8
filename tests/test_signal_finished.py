"""A signal to a workflow that has ended is refused with WorkflowFinished, never kept.

The same answer from Engine.send_signal, Client.send_signal and ``durably signal``;
a resend of a signal delivered before the end is still just a duplicate (False).
Both backends.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import durably
from durably import cli


@durably.workflow
async def quick(x: int) -> int:
    return x + 1


async def test_engine_refuses_a_signal_to_a_finished_workflow(store_url: str) -> None:
    async with durably.Engine(store_url, poll_interval=0.2) as engine:
        handle = await engine.start(quick, 1, workflow_id="done")
        assert await handle.result(timeout=10) == 2
        with pytest.raises(durably.WorkflowFinished, match=r"'done' is completed"):
            await engine.send_signal("done", "go", {"n": 1})
        assert await engine.signals("done") == []


async def test_client_and_cli_refuse_it_the_same_way(store_url: str) -> None:
    async with durably.Engine(store_url, poll_interval=0.2) as engine:
        handle = await engine.start(quick, 1, workflow_id="done")
        assert await handle.result(timeout=10) == 2
    with (
        durably.Client(store_url) as client,
        pytest.raises(durably.WorkflowFinished, match=r"'done' is completed"),
    ):
        client.send_signal("done", "go", 1)
    result = CliRunner().invoke(cli.main, ["--database", store_url, "signal", "done", "go", "1"])
    assert result.exit_code == 1, result.output
    assert "'done' is completed" in result.output
    assert "not kept" in result.output
    with durably.Client(store_url) as client:
        assert client.signals("done") == []


async def test_a_resent_key_after_the_end_is_a_duplicate(store_url: str) -> None:
    async with durably.Engine(store_url, poll_interval=0.2) as engine:
        handle = await engine.start(waits_once, workflow_id="w")
        assert await engine.send_signal("w", "go", "yes", idempotency_key="k") is True
        assert await handle.result(timeout=10) == "yes"
        assert await engine.send_signal("w", "go", "yes", idempotency_key="k") is False


@durably.workflow
async def waits_once() -> str:
    got: str = await durably.wait_for_signal("go")
    return got
