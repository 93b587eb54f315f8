"""A pool of real worker processes on one database, for the multi-worker tests.

Each worker is ``python -m durably.cli --database URL worker tests.multiworker_flows``,
the command people deploy, with its output in a log file. The pool starts,
SIGKILLs, SIGSTOPs and restarts them; the tests read what happened from the
database, the effects file (tests/multiworker_flows.py) and the payments log.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import durably
from tests import children
from tests import multiworker_flows as flows

REPO = children.REPO


@dataclasses.dataclass
class Worker:
    """One worker process and its log."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class Pool:
    """Worker processes sharing one database, an effects file and a payments service."""

    def __init__(
        self,
        url: str,
        tmp: Path,
        payments_url: str,
        *,
        lease: float = 2.0,
        poll: float = 0.5,
        queues: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.tmp = tmp
        self.effects = tmp / "effects.jsonl"
        self.payments_url = payments_url
        self.lease = lease
        self.poll = poll
        self.queues = list(queues)
        self.extra_env = env or {}
        self.workers: list[Worker] = []
        self._logs = 0

    def argv(self) -> list[str]:
        argv = [
            sys.executable, "-m", "durably.cli", "--database", self.url, "-v",
            "worker", "tests.multiworker_flows",
            "--lease", str(self.lease), "--poll", str(self.poll), "--max-recoveries", "50",
        ]  # fmt: skip
        for queue in self.queues:
            argv += ["--queue", queue]
        return argv

    def env(self) -> dict[str, str]:
        extra = {flows.EFFECTS: str(self.effects), flows.PAYMENTS: self.payments_url}
        return children.child_env({**extra, **self.extra_env})

    def spawn(self) -> Worker:
        """Start one more worker (it registers itself within a second or so)."""
        self._logs += 1
        log = self.tmp / f"worker-{self._logs}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.argv(), cwd=REPO, env=self.env(), stdout=out, stderr=subprocess.STDOUT
            )
        worker = Worker(proc, log)
        self.workers.append(worker)
        return worker

    def start(self, count: int) -> list[Worker]:
        started = [self.spawn() for _ in range(count)]
        self.wait_for(lambda: self.registered() >= count, "workers to register")
        return started

    def registered(self) -> int:
        with durably.Client(self.url) as client:
            return len(client.executors())

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        worker.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            worker.proc.wait(10)

    def stop(self) -> None:
        """SIGKILL every worker still running (the end of a test, whatever happened)."""
        for worker in self.workers:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGCONT)
                worker.proc.kill()
            worker.proc.wait(10)

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        tails = []
        for i, worker in enumerate(self.workers, 1):
            state = "alive" if worker.alive() else f"exited {worker.proc.returncode}"
            tails.append(f"--- worker {i} (pid {worker.pid}, {state})\n{worker.output()[-3000:]}")
        return "\n".join(tails)

    def effects_lines(self) -> list[dict[str, Any]]:
        if not self.effects.exists():
            return []
        lines = []
        for line in self.effects.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line torn by a SIGKILL
                lines.append(json.loads(line))
        return lines


@contextlib.contextmanager
def pool(*args: Any, **kwargs: Any) -> Iterator[Pool]:
    workers = Pool(*args, **kwargs)
    try:
        yield workers
    finally:
        workers.stop()


def statuses(url: str, ids: Sequence[str]) -> collections.Counter[str]:
    with durably.Client(url) as client:
        return collections.Counter(client.get_workflow(wid).status for wid in ids)


def all_done(url: str, ids: Sequence[str]) -> bool:
    with durably.Client(url) as client:
        rows = client.list_workflows(limit=len(ids) + 100)
    wanted = set(ids)
    return sum(1 for r in rows if r.workflow_id in wanted and r.finished) == len(wanted)
