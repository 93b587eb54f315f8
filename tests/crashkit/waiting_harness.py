"""Children for the waiting crash tests: runners, ``durably`` CLI commands and workers.

A :class:`Kit` owns one SQLite file and one effects file in a test's tmp dir,
spawns real processes on them (``tests.crashkit.waiting_runner`` children,
``python -m durably.cli ...``), SIGKILLs or SIGTERMs them, and reads the
database file directly with ``sqlite3`` (no durably code involved). A child's
stdout and stderr go to files, so a chatty child never blocks on a full pipe;
every child is reaped when the kit closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.crashkit.harness import REPO, child_env, read_effects

FLOWS = "tests.crashkit.waiting_flows"
T = TypeVar("T")


class Child:
    """One spawned process, its output files and when it started."""

    def __init__(self, argv: list[str], env: dict[str, str], out: Path, err: Path) -> None:
        self.argv, self.out, self.err = argv, out, err
        self.started = time.time()
        with open(out, "w", encoding="utf-8") as o, open(err, "w", encoding="utf-8") as e:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=o, stderr=e)
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait for the exit (SIGKILL it and fail after ``timeout``); the return code."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout}s\n{self.describe()}") from None
        self.ended = self.ended or time.time()
        return rc

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.ended = self.ended or time.time()

    def terminate(self) -> None:
        """SIGTERM; the caller waits."""
        os.kill(self.proc.pid, signal.SIGTERM)

    def stdout(self) -> str:
        return self.out.read_text(encoding="utf-8")

    def stderr(self) -> str:
        return self.err.read_text(encoding="utf-8")

    def output(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for a runner child to exit 0 and return the JSON line it printed."""
        rc = self.wait(timeout)
        assert rc == 0, self.describe()
        lines = [ln for ln in self.stdout().splitlines() if ln.strip()]
        assert lines, self.describe()
        return json.loads(lines[-1])  # type: ignore[no-any-return]

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv[2:])}\nexit {self.proc.returncode}\n--- stdout\n"
            f"{self.stdout()[-3000:]}\n--- stderr\n{self.stderr()[-4000:]}"
        )


class Kit:
    """One database and one effects file, and every process spawned on them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "durably.db"
        self.url = f"sqlite:///{self.db}"
        self.effects = tmp / "effects.jsonl"
        self.children: list[Child] = []
        self.env = child_env({"CRASHKIT_EFFECTS": str(self.effects)})

    def close(self) -> None:
        for child in self.children:
            child.kill()

    def _spawn(self, argv: list[str]) -> Child:
        n = len(self.children)
        child = Child(argv, self.env, self.tmp / f"child{n}.out", self.tmp / f"child{n}.err")
        self.children.append(child)
        return child

    # --- processes ---------------------------------------------------------------------

    def runner(
        self,
        workflow: str,
        workflow_id: str,
        args: Sequence[Any] = (),
        *,
        hold: float = 1.0,
        poll: float = 1.0,
        attach: bool = False,
    ) -> Child:
        """A waiting_runner child that starts (or re-attaches to) one workflow."""
        argv = [
            sys.executable, "-m", "tests.crashkit.waiting_runner",
            "--db", str(self.db), "--id", workflow_id, "--effects", str(self.effects),
            "--hold-seconds", str(hold), "--poll-interval", str(poll),
        ]  # fmt: skip
        argv += ["--attach"] if attach else ["--workflow", workflow, "--args", json.dumps(args)]
        return self._spawn(argv)

    def worker(self) -> Child:
        """``durably worker tests.crashkit.waiting_flows``: the CLI's defaults apply."""
        return self._spawn(self._cli_argv("worker", FLOWS))

    def _cli_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "durably.cli", "--database", self.url, *args]

    def cli(self, *args: str, timeout: float = 30.0) -> str:
        """Run one ``durably`` command to its end; it must exit 0; its stdout."""
        done = subprocess.run(
            self._cli_argv(*args),
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"durably {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    # --- reading the database file and the effects file -----------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
        """Rows of a read query, or None while the database is not there yet (or busy)."""
        if not self.db.exists():
            return None
        try:
            with contextlib.closing(sqlite3.connect(self.db, timeout=5)) as conn:
                return list(conn.execute(sql, params).fetchall())
        except sqlite3.OperationalError:
            return None

    def status(self, workflow_id: str) -> str | None:
        rows = self.query("SELECT status FROM workflows WHERE workflow_id = ?", (workflow_id,))
        return str(rows[0][0]) if rows else None

    def row(self, workflow_id: str) -> dict[str, Any]:
        cols = ("status", "output", "error", "owner", "wake_at", "cancel_requested")
        rows = self.query(
            f"SELECT {', '.join(cols)} FROM workflows WHERE workflow_id = ?", (workflow_id,)
        )
        assert rows, f"no workflow {workflow_id!r}"
        return dict(zip(cols, rows[0], strict=True))

    def journal(self, workflow_id: str) -> list[dict[str, Any]]:
        cols = ("seq", "kind", "name", "status", "attempt", "payload", "started_at", "wake_at")
        rows = self.query(
            f"SELECT {', '.join(cols)} FROM journal WHERE workflow_id = ? ORDER BY seq",
            (workflow_id,),
        )
        return [dict(zip(cols, r, strict=True)) for r in rows or []]

    def read_effects(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_effects(self.effects) if workflow_id in (None, e["wf"])]

    def labels(self, workflow_id: str | None = None) -> Counter[Any]:
        """How many times each step ran, by its first argument (a label, a marker, n)."""
        return Counter(e["args"][0] for e in self.read_effects(workflow_id))

    def wait_until(
        self,
        check: Callable[[], T],
        what: str,
        timeout: float = 15.0,
        child: Child | None = None,
    ) -> T:
        """Poll ``check`` until it returns something truthy; fail if ``child`` exits first."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if child is not None and not child.running():
                raise AssertionError(f"the child exited before {what}\n{child.describe()}")
            if time.monotonic() > deadline:
                extra = f"\n{child.describe()}" if child is not None else ""
                raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
            time.sleep(0.01)
