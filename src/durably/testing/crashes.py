"""Crash your own workflow at every commit boundary and check each recovery.

``crash_points(target, args)`` answers, for a workflow *you* wrote, the question
the refund incident of the seeds asks: "if the process dies right here, what
happens to my side effects?" It

1. runs the workflow once, uninterrupted, in a child process, recording every
   boundary the engine reaches (``durably.faults`` points: ``engine_start``,
   ``before_intent``, ``after_intent``, ``before_call``, ``after_call``,
   ``after_receipt``, ``in_backoff``, ``before_finish``, ``after_finish``) and every
   call of a step function with its idempotency key;
2. for each boundary of that trace, runs a fresh scenario (a new directory, a new
   SQLite file, a new workflow id) whose first process is SIGKILLed exactly
   there (``DURABLY_CRASH_AT=point:step@n`` with ``DURABLY_CRASH_ONCE``), then
   starts the workflow again in new processes until it finishes or parks in
   ``needs_review``;
3. counts, per idempotency key, how often the step function was called (always)
   and how often the key reached your service (with ``effects=``), and judges
   each scenario against the policy the step declared.

Why the counts are right: the child observes the engine through
``durably.faults.observe`` (it replaces nothing). ``step_call.invoke``, the
single place where the engine calls a step function (compensations included),
reports each call *before* it is made, and the child appends one line per call
to a file with ``O_APPEND``, so a call cut short by SIGKILL is still counted
(the kernel keeps what was written). Reconcile functions are lookups, not
effects, and are not counted. The effect log is the user's own evidence and is
never derived from durably.

A run's commit reports each batch once it is durable, and the child appends a
``receipt`` line for a step's completed entry, so a call at that seq after it
would be a completed step running again (promise 2): a violation under every
policy.

This module runs the scenarios; :mod:`durably.testing.crash_report` judges them
and holds the report.

Verdicts, per scenario (counts are compared with the uninterrupted run, so steps
that legitimately retry are not blamed for it):

- plain step: each key may be called at most once more than without the crash
  (at-least-once with a stable key), and the workflow ends as it did without it;
- ``reconcile=``: no key is called more often than without the crash, the
  workflow ends as without it, and the step's receipt is in the journal;
- ``at_most_once=True``: no key is called more often than without the crash; a
  crash between its intent and its receipt parks the workflow in
  ``needs_review``, which is the promise working ("review"), not a failure.

The child processes are started as ``python -c`` with a bootstrap that takes
``DURABLY_CRASH_AT`` out of the environment before durably is imported and hands
it to ``faults.configure`` once the trace is installed: the crash semantics are
``durably.faults``' own, only the moment they are configured differs.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from durably.testing import crash_child, crash_report
from durably.testing.crash_report import (
    CRASH_MARKER,
    UNKNOWN_OUTCOME_POINTS,
    Boundary,
    ChildRun,
    CrashReport,
    KeyCount,
    Raw,
    Scenario,
)

__all__ = [
    "CRASH_MARKER",
    "UNKNOWN_OUTCOME_POINTS",
    "Boundary",
    "ChildRun",
    "CrashReport",
    "CrashToolError",
    "KeyCount",
    "Scenario",
    "crash_points",
    "run_in_child",
]

SCENARIO_ENV = "DURABLY_SCENARIO_DIR"
"""The environment variable naming the scenario directory, for the user's fake services."""

_CRASH_VARS = ("DURABLY_CRASH_AT", "DURABLY_CRASH_ONCE")
_MAX_RUNS = 4  # the crashed process and up to three recoveries

_BOOTSTRAP = (
    "import os, sys\n"
    "spec = os.environ.pop('DURABLY_CRASH_AT', None)\n"
    "from durably.testing import crash_child\n"
    "sys.exit(crash_child.main(sys.argv[1], spec))\n"
)

Effects = str | os.PathLike[str] | Callable[[Path], Mapping[str, int]]


class CrashToolError(Exception):
    """The crash test itself could not run (the uninterrupted run failed, a bad target)."""


# --- running children --------------------------------------------------------------------


def run_in_child(
    target: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    workflow_id: str,
    database_url: str,
    scenario_dir: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    until: Sequence[str] = ("needs_review",),
    timeout: float = 60.0,
) -> ChildRun:
    """Start (or re-attach to) ``workflow_id`` in a new process and wait for it there.

    The child opens an Engine on ``database_url`` (recovering orphaned work),
    starts ``target`` ("module:workflow") with the arguments, and waits until the
    workflow is finished or in one of the ``until`` statuses, then exits 0.
    ``env`` is added to the child's environment: ``DURABLY_CRASH_AT`` and
    ``DURABLY_CRASH_ONCE`` there kill it at a boundary (see ``durably.faults``).
    Every boundary reached is appended to ``boundaries.jsonl`` and every call
    of a step function to ``calls.jsonl`` in ``scenario_dir``, which is also
    given to the child as ``DURABLY_SCENARIO_DIR``.
    """
    from durably import codec

    folder = Path(scenario_dir)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "target": target,
        "call": codec.encode(
            {"args": list(args), "kwargs": dict(kwargs or {})}, where="crash test arguments"
        ),
        "workflow_id": workflow_id,
        "database_url": database_url,
        "dir": str(folder.resolve()),
        "until": list(until),
        "timeout": timeout,
    }
    child_env = _child_env(folder)
    child_env.update(env or {})
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _BOOTSTRAP, json.dumps(config)],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout + 15,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return ChildRun(-1, _text(exc.stdout), _text(exc.stderr) + "\n[killed: timed out]")
    return ChildRun(proc.returncode, proc.stdout, proc.stderr)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _child_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CRASH_VARS}
    env.pop("DURABLY_DATABASE_URL", None)
    paths = [os.getcwd(), *(p for p in sys.path if p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[SCENARIO_ENV] = str(folder.resolve())
    return env


# --- crash_points ------------------------------------------------------------------------


def crash_points(
    target: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
    effects: Effects | None = None,
    database_url_for: Callable[[Path], str] | None = None,
    timeout: float = 60.0,
    workflow_id: str | None = None,
    only: Sequence[str] | None = None,
) -> CrashReport:
    """Kill ``target`` at every boundary of an uninterrupted run, recover it, and judge.

    ``target`` is ``"module:workflow"`` or a decorated workflow defined in an
    importable module. ``effects`` is your evidence of what reached the outside:
    a path to a JSONL log with an ``idempotency_key`` field on each line (a
    relative path is read in each scenario's directory, which your code finds in
    ``DURABLY_SCENARIO_DIR``; an absolute one is shared, and only the lines a
    scenario appended count), or a function of the scenario directory returning
    ``{key: count}``. ``database_url_for(scenario_dir)`` gives each scenario its
    fresh database (default: a SQLite file in the directory). ``timeout`` bounds
    each process. ``workflow_id`` prefixes the ids of the scenarios (each gets
    its own, so a shared deduplicating service never mixes them up). ``only``
    keeps the boundaries whose spec matches one of its shell patterns
    (``["*:issue_refund@*"]``); the default is every boundary.
    """
    spec = _target_spec(target)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="durably-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    prefix = workflow_id or f"crash-{uuid.uuid4().hex[:6]}"
    url_for = database_url_for or (lambda d: f"sqlite:///{d / 'durably.db'}")
    runner = _Runner(spec, tuple(args), dict(kwargs or {}), url_for, effects, timeout)

    baseline = runner.run(root / "00-baseline", f"{prefix}-0", None)
    if baseline.status not in crash_child.FINISHED:
        raise CrashToolError(
            f"{spec} did not finish without a crash (it is {baseline.status}); "
            f"see {baseline.directory}"
        )
    trace = _read_jsonl(baseline.directory / crash_child.TRACE_FILE)
    boundaries = [Boundary(t["point"], t["step"], int(t["nth"])) for t in trace]
    if only is not None:
        chosen = [b for b in boundaries if any(fnmatch.fnmatchcase(b.spec, p) for p in only)]
        if not chosen:
            raise CrashToolError(
                f"no boundary matches {list(only)}; the boundaries are "
                f"{[b.spec for b in boundaries]}"
            )
        boundaries = chosen
    judged = crash_report.judge(baseline, None, None)
    scenarios = []
    for i, boundary in enumerate(boundaries, start=1):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{i:02d}-{boundary.spec}")
        raw = runner.run(root / name, f"{prefix}-{i}", boundary)
        scenarios.append(crash_report.judge(raw, boundary, baseline))
    return CrashReport(spec, root, judged, tuple(scenarios), effects is not None)


def _target_spec(target: Any) -> str:
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise CrashToolError(f"target {target!r}: expected 'module:workflow'")
        return target
    from durably import workflows

    definition = workflows.definition_of(target)
    module = definition.fn.__module__
    if module == "__main__" or "<locals>" in definition.fn.__qualname__:
        raise CrashToolError(
            f"{definition.origin} cannot be imported by a child process; define the "
            "workflow at the top level of an importable module"
        )
    return definition.origin


class _Runner:
    def __init__(
        self,
        target: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        url_for: Callable[[Path], str],
        effects: Effects | None,
        timeout: float,
    ) -> None:
        self.target, self.args, self.kwargs = target, args, kwargs
        self.url_for, self.effects, self.timeout = url_for, effects, timeout

    def run(self, folder: Path, workflow_id: str, boundary: Boundary | None) -> Raw:
        """Run one scenario: crash at ``boundary`` (if any), then recover until it settles."""
        folder.mkdir(parents=True, exist_ok=True)
        url = self.url_for(folder)
        env: dict[str, str] = {}
        if boundary is not None:
            env = {"DURABLY_CRASH_AT": boundary.spec, "DURABLY_CRASH_ONCE": str(folder / "crashed")}
        before = self._effects_offset()
        exits: list[ChildRun] = []
        status = "pending"
        from durably import Client

        with Client(url) as client:
            for _ in range(_MAX_RUNS):
                exit_ = run_in_child(
                    self.target,
                    self.args,
                    self.kwargs,
                    workflow_id=workflow_id,
                    database_url=url,
                    scenario_dir=folder,
                    env=env,
                    timeout=self.timeout,
                )
                exits.append(exit_)
                (folder / f"run-{len(exits)}.log").write_text(exit_.describe(), encoding="utf-8")
                status = _status(client, workflow_id)
                if exit_.returncode not in (0, -9):
                    if boundary is None:  # the uninterrupted run must work
                        raise CrashToolError(
                            f"{self.target} (scenario {folder.name}): {exit_.describe()}"
                        )
                    break  # judged as a violation: a recovery that hangs or breaks
                if status in crash_child.FINISHED or status == "needs_review":
                    break
            return self._collect(client, folder, workflow_id, exits, status, before)

    def _collect(
        self,
        client: Any,
        folder: Path,
        workflow_id: str,
        exits: list[ChildRun],
        status: str,
        before: int,
    ) -> Raw:
        from durably import codec, errors

        result: Any = None
        error: str | None = None
        journal: dict[int, str] = {}
        reason: str | None = None
        try:
            info = client.get_workflow(workflow_id)
            if info.output is not None:
                try:
                    result = codec.decode(info.output, where="workflow output")
                except errors.DurablyError:
                    result = json.loads(info.output)
            error = _error_text(info.error)
            journal = {e.seq: e.status for e in client.history(workflow_id) if e.kind == "step"}
            reviews = client.reviews(workflow_id)
            reason = "; ".join(f"seq {r.seq} {r.step}: {r.reason}" for r in reviews) or None
        except errors.WorkflowNotFound:
            pass
        return Raw(
            folder,
            workflow_id,
            exits,
            status,
            result,
            error,
            journal,
            _read_jsonl(folder / crash_child.CALLS_FILE),
            self._effects(folder, before),
            _read_jsonl(folder / crash_child.TRACE_FILE),
            reason,
        )

    # --- effects -------------------------------------------------------------------

    def _shared_log(self) -> Path | None:
        if isinstance(self.effects, str | os.PathLike):
            path = Path(self.effects)
            return path if path.is_absolute() else None
        return None

    def _effects_offset(self) -> int:
        shared = self._shared_log()
        return shared.stat().st_size if shared is not None and shared.exists() else 0

    def _effects(self, folder: Path, before: int) -> dict[str, int] | None:
        if self.effects is None:
            return None
        if callable(self.effects):
            return {str(k): int(v) for k, v in self.effects(folder).items()}
        path = Path(self.effects)
        if not path.is_absolute():
            return _count_keys(folder / path, 0)
        return _count_keys(path, before)


def _status(client: Any, workflow_id: str) -> str:
    from durably import errors

    try:
        return str(client.get_workflow(workflow_id).status)
    except errors.WorkflowNotFound:
        return "absent"


def _error_text(error: str | None) -> str | None:
    if error is None:
        return None
    try:
        data = json.loads(error)
    except ValueError:
        return error
    if isinstance(data, dict) and "type" in data:
        return f"{str(data['type']).rsplit('.', 1)[-1]}: {data.get('message', '')}"
    return error


def _read_jsonl(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The lines of a JSONL file from ``offset``; torn lines (a killed writer) are skipped."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                out.append(value)
    return out


def _count_keys(path: Path, offset: int) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for line in _read_jsonl(path, offset):
        key = line.get("idempotency_key")
        if isinstance(key, str) and key:
            counts[key] += 1
    return dict(counts)
