"""Agents under SIGKILL: real child processes, a real SQLite file, the real openai client.

A completed model turn is never asked again after a restart (counted from the
fake model server's log) and a completed tool call never runs again (counted
from the tools' effects file).
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from durably import Client, cli
from durably.testing.models import FakeModelServer, by_turn, call, read_log, text, tool_calls
from tests.agentkit import harness, tools


def _lookups(n: int) -> list:
    turns = [
        tool_calls(call("lookup_order", {"order_id": f"A{i}"}, id=f"call_{i}"))
        for i in range(1, n + 1)
    ]
    return [*turns, text(f"All {n} orders shipped.")]


def test_kill_after_the_third_tool_call_asks_no_completed_turn_again(tmp_path: Path) -> None:
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(_lookups(4)), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:lookup_order:call_3"}
        killed = harness.runner(
            db, "crash-1", "Where are my orders?", harness.child_env(server.url, effects, crash)
        )
        assert killed is None, "the first process should have been SIGKILLed"
        assert [r["turn"] for r in read_log(log)] == [0, 1, 2]
        done = harness.runner(
            db, "crash-1", "Where are my orders?", harness.child_env(server.url, effects)
        )

    assert done["status"] == "completed", done
    result = done["result"]
    assert result["output"] == "All 4 orders shipped."
    requests = read_log(log)
    assert [r["turn"] for r in requests] == [0, 1, 2, 3, 4]  # each turn asked exactly once
    assert [e["order_id"] for e in tools.effects(effects)] == ["A1", "A2", "A3", "A4"]
    assert len({e["pid"] for e in tools.effects(effects)}) == 2
    # the restarted run replayed three model calls and paid for two
    served = [r["usage"] for r in requests]
    assert result["replayed"]["calls"] == 3
    assert result["replayed"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in served[:3])
    assert result["replayed"]["completion_tokens"] == sum(
        u["completion_tokens"] for u in served[:3]
    )
    assert result["billed"]["calls"] == 2
    assert result["billed"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in served[3:])
    assert result["summary"].startswith("replayed 3 model calls")
    assert "interrupted" not in result["summary"]
    # the message list of the last request was rebuilt from the journal, not re-asked
    last = requests[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["system", "user"] + ["assistant", "tool"] * 4
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == [
        "call_1",
        "call_2",
        "call_3",
        "call_4",
    ]


def test_parallel_tool_calls_replay_in_the_recorded_order(tmp_path: Path) -> None:
    """Killed while two of three parallel calls run; on restart they finish in another order."""
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    script = by_turn(
        [
            tool_calls(
                call("work", {"name": "a", "delay": 0.8}, id="w_a"),
                call("work", {"name": "b", "delay": 0.0}, id="w_b"),
                call("work", {"name": "c", "delay": 0.4}, id="w_c"),
            ),
            text("all done"),
        ]
    )
    with FakeModelServer(script, log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_receipt:tool:work:w_b"}
        env = harness.child_env(server.url, effects, crash)
        assert harness.runner(db, "par-1", "go", env) is None
        assert [e["name"] for e in tools.effects(effects)] == ["b"]
        reversed_delays = {harness.DELAYS_ENV: '{"a": 0.0, "c": 0.3}'}
        env = harness.child_env(server.url, effects, reversed_delays)
        done = harness.runner(db, "par-1", "go", env)

    assert done["status"] == "completed", done
    assert [e["name"] for e in tools.effects(effects)] == ["b", "a", "c"]  # b never ran again
    order = ["w_a", "w_b", "w_c"]
    assert [m["tool_call_id"] for m in done["result"]["tool_messages"]] == order
    last = read_log(log)[-1]["body"]["messages"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == order
    with Client(f"sqlite:///{db}") as client:
        history = client.history("par-1")
    steps = [e for e in history if e.name.startswith("tool:")]
    assert [e.name for e in steps] == [f"tool:work:{i}" for i in order]
    assert steps[0].seq < steps[1].seq < steps[2].seq
    finished = {e.name: e.finished_at or 0.0 for e in steps}
    assert finished["tool:work:w_a"] < finished["tool:work:w_c"]  # a finished first this time


def test_a_turn_answered_but_not_journaled_is_counted_as_asked_twice(tmp_path: Path) -> None:
    """SIGKILL after the server answered turn 2, before its receipt: it is asked again.

    The fake server's log is the truth: 6 requests for 5 turns. ``durably show``
    and ``usage.summary()`` must count the lost answer and say "billed at least",
    never "each billed once".
    """
    db, effects, log = tmp_path / "agent.db", tmp_path / "effects.jsonl", tmp_path / "model.jsonl"
    with FakeModelServer(by_turn(_lookups(4)), log_path=log) as server:
        crash = {"DURABLY_CRASH_AT": "after_call:llm:chat.completions@2"}
        env = harness.child_env(server.url, effects, crash)
        assert harness.runner(db, "lost-1", "Where are my orders?", env) is None
        assert [r["turn"] for r in read_log(log)] == [0, 1]
        env = harness.child_env(server.url, effects)
        done = harness.runner(db, "lost-1", "Where are my orders?", env)

    assert done["status"] == "completed", done
    requests = read_log(log)
    assert [r["turn"] for r in requests] == [0, 1, 1, 2, 3, 4]
    summary = done["result"]["summary"]
    assert "1 earlier model request retried" in summary, summary
    assert "billed at least" in summary, summary
    shown = CliRunner().invoke(cli.main, ["-d", f"sqlite:///{db}", "show", "lost-1"])
    assert shown.exit_code == 0, shown.output
    text_shown = " ".join(shown.output.split())
    assert "each billed once" not in text_shown
    assert "5 model calls" in text_shown
    assert f"{len(requests)} requests sent" in text_shown, text_shown
    assert "billed at least" in text_shown, text_shown
