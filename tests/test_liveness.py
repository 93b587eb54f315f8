"""An executor alive on this host is never judged dead by another one (liveness.is_dead_here).

Each test runs a real executor in a child process that holds a workflow in a
running step, then opens an engine beside it on the same database: its open
runs a recovery pass, which must leave the live child's workflow alone (the
lease has 30 s to run), and the child then finishes it at the epoch it started.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from tests import (
    children,
    liveness_child,  # noqa: F401  (registers live.held here too)
)


def _readline(proc: subprocess.Popen[str], seconds: float) -> str:
    """The child's next line of stdout, waited for ``seconds`` at most."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(seconds)
    if not got:
        proc.kill()
        raise AssertionError(f"the child said nothing in {seconds} s")
    return got[0].strip()


def _child(prefix: list[str], url: str, wid: str, *extra: str) -> subprocess.Popen[str]:
    """A liveness_child running under ``prefix`` (a namespace's command), once its step runs."""
    argv = [*prefix, sys.executable, "-m", "tests.liveness_child", url, wid, *extra]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=children.child_env(),
        cwd=children.REPO,
        text=True,
    )
    assert _readline(proc, 20) == "ready"
    return proc


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Let the child's step end; what it printed about its workflow."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        line = _readline(proc, 20)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    found: dict[str, Any] = json.loads(line)
    return found


async def _open_beside(url: str, wid: str) -> list[str]:
    """Open (and close) an engine beside the child; the reasons of the workflow's claims."""
    async with durably.Engine(url, lease_seconds=30.0) as engine:
        reasons = [c.reason for c in await engine.claims(wid)]
        await engine.close(drain_timeout=0.1)
    return reasons


def _own_pid_namespace() -> bool:
    """Whether this machine lets us run a process in a pid namespace of its own."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _own_pid_namespace(), reason="needs unshare --pid (Linux, root)")
async def test_an_executor_in_another_pid_namespace_of_this_host_is_not_judged_dead(
    tmp_path: Path,
) -> None:
    """A container sharing the host's name (host networking) has pids of its own: the
    pid it registered means nothing here, and reading it here must not expire its leases
    and take its running workflow."""
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    proc = _child(["unshare", "--pid", "--fork", "--mount-proc"], url, "held-ns")
    try:
        assert await _open_beside(url, "held-ns") == ["start"]
    finally:
        outcome = _finish(proc)
    assert outcome == {"result": "done", "claims": ["start"]}


async def test_an_executor_restarted_under_its_fixed_id_is_judged_by_its_new_pid(
    tmp_path: Path,
) -> None:
    """Killed, then started again with the same ``executor_id`` (a StatefulSet's
    worker-0), an executor registers its new pid: judged by the pid of the killed one,
    it would be found dead, and its running workflow taken while it runs it."""
    url = f"sqlite:///{tmp_path / 'durably.db'}"
    killed = _child([], url, "held-before", "worker-0")
    killed.kill()
    killed.wait()
    assert killed.stdout is not None and killed.stdin is not None
    killed.stdout.close()
    killed.stdin.close()
    proc = _child([], url, "held-fixed", "worker-0")
    try:
        assert await _open_beside(url, "held-fixed") == ["start"]
    finally:
        outcome = _finish(proc)
    assert outcome == {"result": "done", "claims": ["start"]}
