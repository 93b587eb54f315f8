"""Faults of the replay of tasks run at once found in review: ``durably.patched()`` called
in branches, and compensations registered in branches (real SQLite, real SIGKILL)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durably
from tests.agentkit.live import until
from tests.crashkit.harness import killed_once_then_done, query, read_effects

LOG: list[str] = []


@durably.step
async def call(op: str, name: str, delay: float) -> str:
    await asyncio.sleep(delay)
    LOG.append(f"{op} {name}")
    return f"{op}:{name}"


@durably.workflow
async def patched_in_branches() -> list[Any]:
    async def one(name: str, delay: float) -> str:
        await call("fetch", name, delay)
        if durably.patched("new-charge"):
            return await call("new-charge", name, 0.0)
        return await call("charge", name, 0.0)

    done = await asyncio.gather(one("a", 0.3), one("b", 0.0))
    await durably.wait_for_signal("go")
    return done


async def test_patched_in_branches_answers_the_same_on_a_replay(sqlite_url: str) -> None:
    """``b`` asks first in the first run (its fetch ends first) and journals the marker;
    the replay's ``a`` asks first, and must still take the new path, as it did."""
    LOG.clear()
    async with durably.Engine(sqlite_url) as engine:
        handle = await engine.start(patched_in_branches, workflow_id="wf")
        await until(handle, "waiting")
    assert LOG == ["fetch b", "new-charge b", "fetch a", "new-charge a"]
    async with durably.Engine(sqlite_url) as engine:
        await engine.send_signal("wf", "go", None)
        result = await engine.handle("wf").result(timeout=10)
        info = await engine.get_workflow("wf")
    assert result == ["new-charge:a", "new-charge:b"]
    assert info.warnings is None
    assert LOG == ["fetch b", "new-charge b", "fetch a", "new-charge a"]  # nothing ran again


def test_compensations_registered_in_branches_each_run_once_across_a_kill(
    tmp_path: Path,
) -> None:
    """``b``'s booking ends first in the first run, ``a``'s first in the replay: the
    undos must still run in one order in both, each once."""
    wf, exits = killed_once_then_done(tmp_path, "compensated_branches", "wf-undo")
    assert exits[-1].output()["ok"] is False
    undos = sorted(e["args"][1] for e in read_effects(wf.effects) if e["args"][0] == "undo")
    assert undos == ["a", "b"]
    assert query(wf.db, "SELECT status, warnings FROM workflows") == [("failed", None)]


def test_undos_registered_by_branches_before_any_call_run_once_across_a_kill(
    tmp_path: Path,
) -> None:
    """Both undos follow the same call (none yet), and the branches register them in the
    other order on the recovery: they must still run in one order, each once (a swap
    gave the second undo the first's receipt, and ran the first again)."""
    wf, exits = killed_once_then_done(tmp_path, "compensated_before_calls", "wf-undo-tie")
    assert exits[-1].output()["ok"] is False
    undos = [e["args"][1] for e in read_effects(wf.effects) if e["args"][0] == "undo"]
    assert sorted(undos) == ["a", "b"], undos
    assert query(wf.db, "SELECT status, warnings FROM workflows") == [("failed", None)]


def test_undos_given_a_client_run_once_across_a_kill(tmp_path: Path) -> None:
    """As above, each undo given a client that cannot be encoded: the name still tells
    them apart, not which branch registered first."""
    wf, _ = killed_once_then_done(tmp_path, "compensated_through_a_client", "wf-undo-client")
    undos = [e["args"][1] for e in read_effects(wf.effects) if e["args"][0] == "undo"]
    assert sorted(undos) == ["a", "b"], undos
    assert query(wf.db, "SELECT status, warnings FROM workflows") == [("failed", None)]
