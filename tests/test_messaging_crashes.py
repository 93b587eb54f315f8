"""Real SIGKILLs around wait_first, send_signal and set_event from a step, on both backends.

Each test runs a workflow of ``tests/messagingkit/flows.py`` in a child engine
process that kills itself with SIGKILL at a chosen boundary
(``DURABLY_CRASH_AT``), then runs a second child that recovers it, and counts
what really ran (the effects file) and what was committed (the store).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import durably
from tests import children
from tests.messagingkit import flows


def run_child(
    url: str, tmp: Path, workflow: str, workflow_id: str, args: list[Any], crash: str | None
) -> subprocess.CompletedProcess[str]:
    extra = {flows.EFFECTS: str(tmp / "effects.jsonl")}
    if crash is not None:
        extra["DURABLY_CRASH_AT"] = crash
    return subprocess.run(
        children.python(
            "-m", "tests.messagingkit.child", url, workflow, workflow_id, json.dumps(args)
        ),
        cwd=children.REPO,
        env=children.child_env(extra),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def output(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["ok"], line
    return line["result"]


def killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -9, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"


def effects(tmp: Path) -> Counter[str]:
    path = tmp / "effects.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(json.loads(line)["label"] for line in lines)


def test_kill_after_wait_first_returned_recovers_the_same_winner(
    store_url: str, tmp_path: Path
) -> None:
    killed(run_child(store_url, tmp_path, "race", "race", [], "after_wait:wait_first"))
    # the winner ran; the loser had started (and was cut) when the outcome committed
    assert effects(tmp_path) == {"loser": 1, "winner": 1, "winner end": 1}
    with durably.Client(store_url) as client:
        wait = next(e for e in client.history("race") if e.kind == "wait")
    assert json.loads(wait.payload or "") == {"count": 2, "done": [1]}

    assert output(run_child(store_url, tmp_path, "race", "race", [], None)) == [1, "winner"]
    # recovery replayed the winner from its receipt and never started the loser again
    assert effects(tmp_path) == {
        "loser": 1,
        "winner": 1,
        "winner end": 1,
        "after 1": 1,
        "after 1 end": 1,
    }


@pytest.mark.parametrize("point", ["before_wait", "after_wait"])
def test_kill_around_a_race_of_two_signal_waits_loses_neither_signal(
    store_url: str, tmp_path: Path, point: str
) -> None:
    # Both signals are there before the race: both waits take theirs at once, "a" wins.
    with durably.Client(store_url) as client:
        client.start(flows.signal_race, workflow_id="sig-race")
        client.send_signal("sig-race", "a", "A")
        client.send_signal("sig-race", "b", "B")
    killed(run_child(store_url, tmp_path, "signal_race", "sig-race", [], f"{point}:wait_first"))
    with durably.Client(store_url) as client:
        taken = {s["payload"]: s["consumed_seq"] for s in client.signals("sig-race")}
        kept = {e.seq: e.kind for e in client.history("sig-race")}
    if point == "before_wait":  # killed with the race decided but not journaled
        assert (taken, kept) == ({'"A"': 1, '"B"': 2}, {1: "signal", 2: "signal"})
    else:  # the loser's signal was given back with the race's outcome; its seq holds nothing
        assert (taken, kept) == ({'"A"': 1, '"B"': None}, {1: "signal", 3: "wait"})

    assert output(run_child(store_url, tmp_path, "signal_race", "sig-race", [], None)) == [
        0,
        "A",
        "B",
    ]
    with durably.Client(store_url) as client:
        taken = {s["payload"]: s["consumed_seq"] for s in client.signals("sig-race")}
        received = [(e.seq, e.payload) for e in client.history("sig-race") if e.kind == "signal"]
    # each signal went to exactly one wait: "b" to the wait after the race (seq 4)
    assert taken == {'"A"': 1, '"B"': 4}
    assert received == [(1, '"A"'), (4, '"B"')]


def test_kill_right_after_a_send_committed_delivers_exactly_one_signal(
    store_url: str, tmp_path: Path
) -> None:
    with durably.Client(store_url) as client:
        client.start(flows.target, workflow_id="target")
    killed(run_child(store_url, tmp_path, "sender", "sender", ["target"], "after_send:go"))
    assert effects(tmp_path) == {}  # it died before the step after the send
    with durably.Client(store_url) as client:
        sent = client.signals("target")
    assert [(s["name"], s["idempotency_key"]) for s in sent] == [("go", "sender:1")]

    assert output(run_child(store_url, tmp_path, "sender", "sender", ["target"], None)) == "sent"
    assert output(run_child(store_url, tmp_path, "target", "target", [], None)) == [
        {"from": "sender"},
        None,  # no second signal ever came
    ]
    with durably.Client(store_url) as client:
        sent = client.signals("target")
        (send,) = [e for e in client.history("sender") if e.kind == "send_signal"]
    assert len(sent) == 1 and sent[0]["consumed_seq"] == 1
    assert (send.name, send.status) == ("go -> target", "completed")
    assert effects(tmp_path) == {"after send": 1, "after send end": 1}


def test_kill_before_a_step_receipt_publishes_its_event_only_with_the_retry(
    store_url: str, tmp_path: Path
) -> None:
    killed(run_child(store_url, tmp_path, "step_event", "ev", [], "after_call:mk_progress"))
    assert effects(tmp_path) == {"progress": 1}  # the step ran and set its event
    with durably.Client(store_url) as client, pytest.raises(TimeoutError):
        client.get_event("ev", "progress")  # but nothing was published without a receipt

    assert output(run_child(store_url, tmp_path, "step_event", "ev", [], None)) == "ok"
    assert effects(tmp_path) == {"progress": 2}
    with durably.Client(store_url) as client:
        assert client.get_event("ev", "progress") == 1  # the attempt that committed
