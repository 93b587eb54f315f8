"""Spawn, kill and restart runner children; read what they did.

Children are real processes (``sys.executable -m tests.crashkit.runner``) on a
real SQLite file; a crash is a real SIGKILL, either injected by
``durably.faults`` (``DURABLY_CRASH_AT``) or sent from here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import children

REPO = children.REPO
CRASH_VARS = ("DURABLY_CRASH_AT", "DURABLY_CRASH_ONCE")
CHILD_TIMEOUT = 60.0


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a runner child: ours, no crash plan unless given, repo importable."""
    return children.child_env(extra, drop=(*CRASH_VARS, "DURABLY_DATABASE_URL"))


@dataclasses.dataclass
class Workflow:
    """Where and what one runner child runs."""

    db: Path
    workflow: str
    workflow_id: str
    args: Sequence[Any]
    effects: Path
    lease_seconds: float | None = None
    max_recoveries: int | None = None

    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "tests.crashkit.runner",
            "--db",
            str(self.db),
            "--workflow",
            self.workflow,
            "--id",
            self.workflow_id,
            "--args",
            json.dumps(list(self.args)),
            "--effects",
            str(self.effects),
        ]
        if self.lease_seconds is not None:
            argv += ["--lease-seconds", str(self.lease_seconds)]
        if self.max_recoveries is not None:
            argv += ["--max-recoveries", str(self.max_recoveries)]
        return argv

    def spawn(self, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a runner child (the caller waits for it or kills it)."""
        return subprocess.Popen(
            self.argv(),
            cwd=REPO,
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@dataclasses.dataclass
class Exit:
    """How one child ended."""

    returncode: int
    stdout: str
    stderr: str
    started: float  # time.time() just before spawning
    ended: float  # time.time() just after it was reaped

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def output(self) -> dict[str, Any]:
        """The JSON line the runner printed."""
        assert self.returncode == 0, self.describe()
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        assert lines, self.describe()
        return json.loads(lines[-1])  # type: ignore[no-any-return]

    def describe(self) -> str:
        return (
            f"child exited {self.returncode}\n--- stdout\n{self.stdout}\n"
            f"--- stderr\n{self.stderr[-4000:]}"
        )


def finish(proc: subprocess.Popen[str], started: float, timeout: float = CHILD_TIMEOUT) -> Exit:
    """Wait for a child (killing it after ``timeout``) and collect its output."""
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"child ran longer than {timeout}s\n{err[-4000:]}") from None
    return Exit(proc.returncode, out, err, started, time.time())


def run_once(wf: Workflow, env: Mapping[str, str] | None = None) -> Exit:
    """Run one child to its end (normal exit or SIGKILL)."""
    started = time.time()
    return finish(wf.spawn(env), started)


def kill_when(
    wf: Workflow, marker: Path, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Exit:
    """Run a child and SIGKILL it from outside as soon as ``marker`` exists."""
    started = time.time()
    proc = wf.spawn(env)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            result = finish(proc, started)
            raise AssertionError(f"{marker} never appeared\n{result.describe()}")
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    return finish(proc, started)


EnvPlan = Sequence[Mapping[str, str]] | Callable[[int], Mapping[str, str] | None]


def run_until_done(
    wf: Workflow,
    envs: EnvPlan = (),
    *,
    max_runs: int = 10,
    pause_after_kill: float = 0.0,
) -> list[Exit]:
    """Run children until one exits 0, restarting after every SIGKILL.

    ``envs`` gives the extra environment of each run (a sequence, indexed by run
    number, runs past its end get none; or a function of the run number). Any
    exit other than 0 or SIGKILL fails the test, and so do more than
    ``max_runs`` runs. Returns every run's Exit, the last one successful.
    """
    exits: list[Exit] = []
    for i in range(max_runs):
        result = run_once(wf, _env_of_run(envs, i))
        exits.append(result)
        if result.returncode == 0:
            return exits
        assert result.killed, result.describe()
        if pause_after_kill:
            time.sleep(pause_after_kill)
    raise AssertionError(
        f"{wf.workflow_id} not done after {max_runs} runs; last:\n{exits[-1].describe()}"
    )


def killed_once_then_done(
    tmp_path: Path, workflow: str, workflow_id: str
) -> tuple[Workflow, list[Exit]]:
    """Run ``workflow`` (its one argument: a kill marker it creates when it kills its
    executor) on a database in ``tmp_path`` until done: SIGKILLed once, then completed."""
    wf = Workflow(
        db=tmp_path / "durably.db",
        workflow=workflow,
        workflow_id=workflow_id,
        args=[str(tmp_path / "killed")],
        effects=tmp_path / "effects.jsonl",
    )
    exits = run_until_done(wf)
    assert [e.returncode for e in exits] == [-9, 0], [e.describe() for e in exits]
    return wf, exits


def _env_of_run(envs: EnvPlan, i: int) -> Mapping[str, str] | None:
    if callable(envs):
        return envs(i)
    return envs[i] if i < len(envs) else None


def crash_once(spec: str, marker: Path) -> dict[str, str]:
    """The environment that SIGKILLs a child at ``spec`` unless ``marker`` exists."""
    return {"DURABLY_CRASH_AT": spec, "DURABLY_CRASH_ONCE": str(marker)}


# --- reading what happened -----------------------------------------------------------


def read_effects(path: Path) -> list[dict[str, Any]]:
    """Every step invocation recorded, in the order they were appended."""
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def count_by_step(effects: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return dict(collections.Counter(e["step"] for e in effects))


def of_step(effects: Iterable[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in effects if e["step"] == name]


def query(db: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run a read query on the database file directly (no durably code involved)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return list(conn.execute(sql, params).fetchall())


def journal_rows(db: Path, workflow_id: str) -> list[dict[str, Any]]:
    """The workflow's rows of the ``journal`` table, by seq."""
    cols = ("seq", "kind", "name", "status", "attempt", "payload", "wake_at")
    rows = query(
        db,
        f"SELECT {', '.join(cols)} FROM journal WHERE workflow_id = ? ORDER BY seq",
        (workflow_id,),
    )
    return [dict(zip(cols, r, strict=True)) for r in rows]


def workflow_row(db: Path, workflow_id: str) -> dict[str, Any]:
    """The workflow's row of the ``workflows`` table."""
    cols = ("status", "output", "error", "owner", "epoch", "crash_count")
    rows = query(
        db, f"SELECT {', '.join(cols)} FROM workflows WHERE workflow_id = ?", (workflow_id,)
    )
    assert len(rows) == 1, f"{workflow_id!r}: {len(rows)} rows"
    return dict(zip(cols, rows[0], strict=True))


def claims(db: Path, workflow_id: str) -> list[dict[str, Any]]:
    """The workflow's rows of the ``claims`` table, by epoch."""
    cols = ("epoch", "owner", "previous_owner", "reason")
    rows = query(
        db,
        f"SELECT {', '.join(cols)} FROM claims WHERE workflow_id = ? ORDER BY epoch",
        (workflow_id,),
    )
    return [dict(zip(cols, r, strict=True)) for r in rows]
