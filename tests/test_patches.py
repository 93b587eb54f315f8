"""``durably.patched()`` and ``deprecate_patch()`` across a SIGKILL and a deploy, both backends.

A real child process (tests/patchkit.py) runs the workflow under one code, is
killed with SIGKILL inside a step, and a new process with other code recovers it.
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
from click.testing import CliRunner

import durably
from durably import cli
from durably.storage import create_store
from tests import children

TIMEOUT = 90.0


def _spawn(
    url: str, wid: str, effects: Path, code: str, hang: Path | None
) -> subprocess.Popen[str]:
    env = {"PATCHKIT_CODE": code}
    if hang is not None:
        env["PATCHKIT_HANG"] = str(hang)
    return subprocess.Popen(
        children.python("-m", "tests.patchkit", url, wid, str(effects)),
        cwd=children.REPO,
        env=children.child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed_in_hang(url: str, wid: str, tmp_path: Path, code: str) -> None:
    """Run the workflow under ``code`` until its ``hang`` step, then SIGKILL the process."""
    marker = tmp_path / f"{wid}.hanging"
    proc = _spawn(url, wid, tmp_path / "effects.jsonl", code, marker)
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"never reached the hang step\n{out}\n{err[-3000:]}")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def run_to_end(url: str, wid: str, tmp_path: Path, code: str) -> dict[str, Any]:
    proc = _spawn(url, wid, tmp_path / "effects.jsonl", code, None)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def effects(tmp_path: Path) -> collections.Counter[str]:
    path = tmp_path / "effects.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(json.loads(line)["step"] for line in lines)


def journal_of(url: str, wid: str) -> list[tuple[str, str]]:
    store = create_store(url)
    store.open()
    try:
        return [(e.kind, e.name) for e in store.load_history(wid)]
    finally:
        store.close()


def test_a_workflow_that_passed_the_point_under_old_code_takes_the_old_path(
    store_url: str, tmp_path: Path
) -> None:
    killed_in_hang(store_url, "wf-old", tmp_path, code="old")
    assert effects(tmp_path) == {"first": 1, "old_path": 1, "hang": 1}

    out = run_to_end(store_url, "wf-old", tmp_path, code="new")

    assert out == {"ok": True, "result": ["first", "old_path", "patched=False", "hang", "last"]}
    # the old path's receipt was replayed, the new path never ran, nothing ran twice but hang
    assert effects(tmp_path) == {"first": 1, "old_path": 1, "hang": 2, "last": 1}
    assert journal_of(store_url, "wf-old") == [
        ("step", "first"), ("step", "old_path"), ("step", "hang"), ("step", "last"),
    ]  # fmt: skip


def test_a_workflow_that_reaches_the_point_under_new_code_takes_the_new_path_for_good(
    store_url: str, tmp_path: Path
) -> None:
    killed_in_hang(store_url, "wf-new", tmp_path, code="new")
    assert journal_of(store_url, "wf-new")[:3] == [
        ("step", "first"), ("patch", "fix-1"), ("step", "new_path"),
    ]  # fmt: skip

    out = run_to_end(store_url, "wf-new", tmp_path, code="new")

    assert out == {"ok": True, "result": ["first", "new_path", "patched=True", "hang", "last"]}
    assert effects(tmp_path) == {"first": 1, "new_path": 1, "hang": 2, "last": 1}
    # `durably show` names the marker, as a quiet row (a value journaled for replay)
    shown = CliRunner().invoke(cli.main, ["-d", store_url, "show", "wf-new", "--json"])
    assert shown.exit_code == 0, shown.output
    [marker] = [r for r in json.loads(shown.output)["timeline"] if r.get("kind") == "patch"]
    assert (marker["seq"], marker["label"], marker["quiet"]) == (2, "patch() fix-1", True)


def test_deprecate_patch_replays_journals_with_the_marker_and_without(
    store_url: str, tmp_path: Path
) -> None:
    # with the marker: started under the patched code, recovered by the clean-up
    killed_in_hang(store_url, "wf-marked", tmp_path, code="new")
    out = run_to_end(store_url, "wf-marked", tmp_path, code="deprecated")
    assert out == {"ok": True, "result": ["first", "new_path", "patched=True", "hang", "last"]}
    assert effects(tmp_path) == {"first": 1, "new_path": 1, "hang": 2, "last": 1}
    # without: started under the clean-up, killed, recovered by it; no marker is journaled
    killed_in_hang(store_url, "wf-clean", tmp_path, code="deprecated")
    out = run_to_end(store_url, "wf-clean", tmp_path, code="deprecated")
    assert out["ok"] is True, out
    assert journal_of(store_url, "wf-clean") == [
        ("step", "first"), ("step", "new_path"), ("step", "hang"), ("step", "last"),
    ]  # fmt: skip


def test_old_code_replaying_a_patched_journal_diverges_naming_the_patch(
    store_url: str, tmp_path: Path
) -> None:
    """A rollback to code without the patch meets the marker: a readable divergence."""
    killed_in_hang(store_url, "wf-back", tmp_path, code="new")
    out = run_to_end(store_url, "wf-back", tmp_path, code="old")
    assert out["ok"] is False and out["error_type"] == "NonDeterminismError", out
    assert "seq 2" in out["message"], out
    assert "patch 'fix-1'" in out["message"] and "step 'old_path'" in out["message"], out
    assert "patchkit.py:" in out["message"], out  # the line of the old code's call


@pytest.mark.parametrize("bad", ["", "  ", 3, "a\x00b"])
def test_a_bad_change_id_is_refused_naming_the_call(sqlite_url: str, bad: Any) -> None:
    import asyncio

    @durably.workflow(name=f"bad-patch-{bad!r}")
    async def bad_patch() -> bool:
        return durably.patched(bad)

    async def main() -> None:
        async with durably.Engine(sqlite_url) as engine:
            handle = await engine.start(bad_patch)
            with pytest.raises(durably.InvalidName, match=r"durably\.patched\(\) "):
                await handle.result(timeout=20)

    asyncio.run(main())


def test_patched_outside_a_workflow_is_refused() -> None:
    with pytest.raises(durably.NotInWorkflow, match="patched"):
        durably.patched("fix-1")
    with pytest.raises(durably.NotInWorkflow, match="deprecate_patch"):
        durably.deprecate_patch("fix-1")
