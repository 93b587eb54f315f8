"""Golden journals: recorded journals that must keep replaying the same way across releases.

Each file in golden/ holds a workflow's journal and the durable calls its code
makes on replay, with what each call must get: ``return``/``raise``/``backoff``/
``reconcile``/``review``/``run`` for steps (replay.plan_step), ``recorded`` for a
journaled value, ``new`` for a call beyond the journal, ``cancelled`` where a
cancellation was delivered, and ``diverged`` where the code no longer matches.
Pure: the replayer and the decisions only, no engine and no database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durably import errors, journal, replay

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data["entries"] = [journal.Entry(**raw) for raw in data["entries"]]
    return data


def test_there_are_golden_journals() -> None:
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_journal_replays_as_recorded(path: Path) -> None:
    golden = load(path)
    replayer = replay.Replayer(golden["workflow_id"], golden["entries"])
    diverged = False
    for call in golden["calls"]:
        seq = replayer.next_seq()
        where = f"{path.name} seq {seq} ({call['kind']} {call['name']!r})"
        if call["expect"] == "diverged":
            with pytest.raises(errors.NonDeterminismError) as caught:
                replayer.lookup(seq, call["kind"], call["name"])
            assert call["recorded"] in str(caught.value), where
            diverged = True
            continue
        entry = replayer.lookup(seq, call["kind"], call["name"])
        if call["expect"] == "new":
            assert entry is None, where
        elif call["expect"] == "cancelled":
            assert entry is not None and entry.kind == journal.Kind.CANCEL, where
        elif call["expect"] == "recorded":
            assert entry is not None and entry.status in ("completed", "timed_out"), where
        else:
            plan = replay.plan_step(entry, reconciles=call["reconciles"])
            assert plan.action.value == call["expect"], where
            assert plan.attempt == call["attempt"], where
            assert plan.wake_at == call.get("wake_at"), where
    if diverged:
        with pytest.raises(errors.NonDeterminismError):
            replayer.check_finished()
    else:
        replayer.check_finished()  # the code made every call the journal holds
