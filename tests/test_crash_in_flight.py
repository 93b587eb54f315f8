"""A real SIGKILL while many workflows are in flight and their commits are shared.

With dozens of workflows in flight, a step's commit is not its own: on SQLite the
busy event loop gathers them into one transaction on its thread, on PostgreSQL a
store thread sends a group of them ahead in one pipeline. Either way a workflow
may move on only once its step's result is durable. Each test runs forty chained
workflows (``tests.inflight_child``: every step is given its predecessor's token
and logs it), kills the process from outside at three points, runs it once more
to the end, and checks the effects file against the journal: no step ever ran on
a token the journal lost, and only a step that was running at a kill ran again.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests import children

WORKFLOWS = 40
STEPS = 30
KILLS_AT = (250, 550, 850)  # effect lines, of WORKFLOWS * STEPS = 1,200


def _spawn(url: str, effects: Path, *extra: str) -> subprocess.Popen[str]:
    argv = children.python(
        "-m",
        "tests.inflight_child",
        "--url",
        url,
        "--effects",
        str(effects),
        "--workflows",
        str(WORKFLOWS),
        "--steps",
        str(STEPS),
        "--lease-seconds",
        "2",
        *extra,
    )
    return subprocess.Popen(
        argv,
        cwd=children.REPO,
        env=children.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(effects: Path) -> int:
    try:
        with effects.open("rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def _kill_at(url: str, effects: Path, lines: int, *extra: str) -> int:
    """Run a child and SIGKILL it once the effects file has ``lines`` lines; its pid."""
    proc = _spawn(url, effects, *extra)
    deadline = time.monotonic() + 60
    while _lines(effects) < lines:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"child ended before the kill ({proc.returncode}):\n{err}")
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return proc.pid


def _crash_and_finish(url: str, tmp_path: Path, *extra: str) -> None:
    """Kill a child at each of KILLS_AT, run the last to the end, check what ran."""
    effects = tmp_path / "effects.jsonl"
    killed = [_kill_at(url, effects, lines, *extra) for lines in KILLS_AT]
    results = _run_to_end(url, effects, *extra)
    _check(results, _effects(effects), killed)


def _run_to_end(url: str, effects: Path, *extra: str) -> dict[str, list[str]]:
    proc = _spawn(url, effects, *extra)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-4000:]
    result: dict[str, list[str]] = json.loads(out.strip().splitlines()[-1])
    return result


def _effects(effects: Path) -> list[dict[str, Any]]:
    # A line cut short by the kill (its write unfinished) is not an effect.
    lines = effects.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _check(results: dict[str, list[str]], effects: list[dict[str, Any]], killed: list[int]) -> None:
    assert sorted(results) == sorted(f"chain-{w}" for w in range(WORKFLOWS))
    assert all(len(tokens) == STEPS for tokens in results.values())
    runs: dict[tuple[int, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for e in effects:
        runs[(e["w"], e["k"])].append(e)
    assert set(runs) == {(w, k) for w in range(WORKFLOWS) for k in range(STEPS)}
    for pid in killed:  # each kill came midway, with many workflows in flight
        ran = [e for e in effects if e["pid"] == pid]
        assert len({e["w"] for e in ran}) > WORKFLOWS // 4, len(ran)
    assert any(e["pid"] not in killed for e in effects)
    again: collections.Counter[tuple[int, int]] = collections.Counter()
    for (w, k), done in runs.items():
        recorded = results[f"chain-{w}"]
        # Every run of a step was given the token its predecessor's journal entry holds:
        # no step ever went on from a result that was not yet durable.
        assert all(e["prev"] == (recorded[k - 1] if k else "") for e in done), (w, k, done)
        # The journal holds the last run's result.
        assert done[-1]["token"] == recorded[k], (w, k, done)
        # A step ran again only after a kill that found it running: every run but the
        # last was in a killed process, each in another one.
        earlier = [e["pid"] for e in done[:-1]]
        assert all(pid in killed for pid in earlier), (w, k, done)
        assert len(set(earlier)) == len(earlier), (w, k, done)
        for pid in earlier:
            again[(w, pid)] += 1
    # A kill finds at most one step of a workflow running.
    assert all(n == 1 for n in again.values()), again


@pytest.mark.parametrize("mode", ["FULL", "NORMAL"])
def test_sqlite_gathered_commits_survive_a_kill_midway(tmp_path: Path, mode: str) -> None:
    _crash_and_finish(f"sqlite:///{tmp_path / 'durably.db'}?synchronous={mode}", tmp_path)


def test_sqlite_store_thread_commits_survive_a_kill_midway(tmp_path: Path) -> None:
    _crash_and_finish(f"sqlite:///{tmp_path / 'durably.db'}", tmp_path, "--no-inline")


@pytest.mark.parametrize("connections", [1, 3])
def test_postgres_grouped_commits_survive_a_kill_midway(
    tmp_path: Path, postgres_url: str, connections: int
) -> None:
    sep = "&" if "?" in postgres_url else "?"
    _crash_and_finish(f"{postgres_url}{sep}connections={connections}", tmp_path)
