"""Two people approve one pending tool call at the same instant: one decides, the other
is told ApprovalAlreadyDecided (never a raw database error). Both backends."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import agents
from durably.testing.models import call, text, tool_calls
from tests.agentkit import harness, tools
from tests.agentkit.live import live, until

REFUND = tool_calls(call("refund", {"order_id": "A1", "cents": 50_000}, id="call_r"))


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv(harness.EFFECTS_ENV, str(path))
    return path


def approve_at_once(url: str, pending: agents.PendingApproval) -> list[Any]:
    """Two Clients (two connections) approve on a barrier; each one's result or error."""
    clients = [durably.Client(url), durably.Client(url)]
    for c in clients:
        c.open()
    barrier = threading.Barrier(2)
    got: list[Any] = [None, None]

    def decide(i: int) -> None:
        barrier.wait()
        try:
            got[i] = agents.approve(clients[i], "wf", by=f"person-{i}", expect=pending)
        except Exception as exc:
            got[i] = exc

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for c in clients:
        c.close()
    return got


async def test_two_approvers_at_once_one_decides(store_url: str, effects: Path) -> None:
    async with live(store_url, [REFUND, text("Refunded.")], [tools.refund]) as s:
        handle = await s.start()
        await until(handle, "waiting")
        [pending] = await agents.list_approvals(s.engine)
        got = await asyncio.to_thread(approve_at_once, store_url, pending)
        assert sum(isinstance(g, agents.PendingApproval) for g in got) == 1, got
        assert sum(isinstance(g, agents.ApprovalAlreadyDecided) for g in got) == 1, got
        assert (await handle.result(timeout=20))["output"] == "Refunded."
        assert len(await s.engine.signals("wf")) == 1
    assert len(tools.effects(effects)) == 1
