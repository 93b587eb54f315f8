"""Crash your own workflow at every commit boundary and check each recovery.

``crash_points(target, args)`` answers, for a workflow *you* wrote, the question
the refund incident of the seeds asks: "if the process dies right here, what
happens to my side effects?" It

1. runs the workflow once, uninterrupted, in a child process, recording every
   boundary the engine reaches (``durably.faults`` points: ``engine_start``,
   ``before_intent``, ``after_intent``, ``before_call``, ``after_call``,
   ``after_receipt``, ``in_backoff``, ``before_finish``) and every call of a step
   function with its idempotency key;
2. for each boundary of that trace, runs a fresh scenario (a new directory, a new
   SQLite file, a new workflow id) whose first process is SIGKILLed exactly
   there (``DURABLY_CRASH_AT=point:step@n`` with ``DURABLY_CRASH_ONCE``), then
   starts the workflow again in new processes until it finishes or parks in
   ``needs_review``;
3. counts, per idempotency key, how often the step function was called (always)
   and how often the key reached your service (with ``effects=``), and judges
   each scenario against the policy the step declared.

Why the counts are right: the child wraps ``step_runner.invoke``, the single
place where the engine calls a step function (compensations included), and
appends one line per call to a file *before* the call, with ``O_APPEND`` and a
flush, so a call cut short by SIGKILL is still counted (the kernel keeps what
was written). Reconcile functions are lookups, not effects, and are not counted.
The effect log is the user's own evidence and is never derived from durably.

The child also wraps ``Run.commit`` and appends a ``receipt`` line once a
step's completed entry is durable, so a call of that key after it would be a
completed step running again (promise 2): a violation under every policy.

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
import dataclasses
import fnmatch
import io
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

import click
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from durably.testing import crash_child

__all__ = [
    "Boundary",
    "ChildRun",
    "CrashReport",
    "CrashToolError",
    "KeyCount",
    "Scenario",
    "crash_points",
    "run_in_child",
    "test_crashes_command",
]

SCENARIO_ENV = "DURABLY_SCENARIO_DIR"
"""The environment variable naming the scenario directory, for the user's fake services."""

CRASH_MARKER = "crashed"

#: Boundaries where an intent is committed and its receipt is not: the outcome is unknown.
UNKNOWN_OUTCOME_POINTS = frozenset({"after_intent", "before_call", "after_call"})
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


# --- the report ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """One boundary of the uninterrupted run: the ``nth`` time ``point`` was reached for ``step``.

    ``step`` is the step name (the workflow name for ``before_finish``, empty for
    ``engine_start``).
    """

    point: str
    step: str
    nth: int

    @property
    def spec(self) -> str:
        """The ``DURABLY_CRASH_AT`` value that kills a process exactly here."""
        head = f"{self.point}:{self.step}" if self.step else self.point
        return f"{head}@{self.nth}"

    def __str__(self) -> str:
        return self.spec


@dataclasses.dataclass(frozen=True, slots=True)
class KeyCount:
    """How often one idempotency key was used in a scenario, and how often without a crash.

    ``calls`` counts calls of the step function (durably's own count);
    ``effects`` counts the key's lines in the user's effect log (None without one).
    ``limit_calls`` and ``limit_effects`` are the most the step's policy allows here.
    """

    key: str
    step: str
    seq: int | None
    policy: str  # "plain", "reconcile", "at_most_once" or "unknown" (a key only in effects)
    calls: int
    effects: int | None
    baseline_calls: int
    baseline_effects: int | None
    limit_calls: int
    limit_effects: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """One run of the workflow (killed at ``boundary`` unless it is the baseline) and its end."""

    boundary: Boundary | None
    workflow_id: str
    directory: Path
    exit_codes: tuple[int, ...]
    died: bool  # the first process was SIGKILLed at this very boundary
    status: str
    result: Any
    error: str | None
    keys: tuple[KeyCount, ...]
    verdict: str  # "ok", "review" (an expected needs_review) or "violation"
    problems: tuple[str, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        """Whether the scenario kept every promise of the steps' declared policies."""
        return self.verdict != "violation"


@dataclasses.dataclass(frozen=True, slots=True)
class CrashReport:
    """Every boundary of one workflow, crashed and recovered. ``ok`` when nothing was violated."""

    target: str
    workdir: Path
    baseline: Scenario
    scenarios: tuple[Scenario, ...]
    has_effects: bool

    @property
    def ok(self) -> bool:
        """No scenario violated its steps' declared policy."""
        return all(s.ok for s in self.scenarios)

    @property
    def violations(self) -> list[Scenario]:
        """The scenarios that broke a promise."""
        return [s for s in self.scenarios if not s.ok]

    def scenario(self, spec: str) -> Scenario:
        """The scenario crashed at ``spec`` (``"after_call:issue_refund@1"``)."""
        for s in self.scenarios:
            if s.boundary is not None and s.boundary.spec == spec:
                return s
        raise KeyError(f"no boundary {spec!r}; known: {[str(s.boundary) for s in self.scenarios]}")

    def summary(self) -> str:
        """One line: how many boundaries, and how they ended."""
        counts = collections.Counter(s.verdict for s in self.scenarios)
        return (
            f"{self.target}: {len(self.scenarios)} boundaries crashed: {counts['ok']} ok, "
            f"{counts['review']} parked for review as declared, {counts['violation']} violations"
        )

    def rich_table(self) -> Table:
        """The report as a rich Table: one row per scenario, the uninterrupted run first.

        Fits 80 columns: the boundary (what ``--only`` takes) and the counts fold,
        never cut; the result is cut first. User text is never read as markup.
        """
        table = Table(title=Text(self.summary()), box=None, title_justify="left", pad_edge=False)
        table.add_column("#", no_wrap=True)
        table.add_column("boundary", overflow="fold", ratio=4, min_width=12)
        table.add_column("died", no_wrap=True)
        table.add_column("runs", no_wrap=True)
        table.add_column("status", overflow="fold", ratio=2)
        table.add_column("result", no_wrap=True, overflow="ellipsis", ratio=2, max_width=20)
        table.add_column("calls", overflow="fold", ratio=3)
        if self.has_effects:
            table.add_column("effects", overflow="fold", ratio=3)
        table.add_column("verdict", overflow="fold", ratio=2)
        for i, s in enumerate((self.baseline, *self.scenarios)):
            style = {"ok": "green", "review": "magenta"}.get(s.verdict, "red")
            verdict = Text(s.verdict if s.verdict in ("ok", "review") else "VIOLATION", style)
            if s.note and not s.problems:
                verdict.append(f" ({s.note})")
            row: list[Text | str] = [
                str(i),
                Text("(no crash)" if s.boundary is None else s.boundary.spec),
                "" if s.boundary is None else Text(*(("yes",) if s.died else ("no", "red"))),
                str(len(s.exit_codes)),
                Text(s.status),
                Text(_preview(s.result if s.status == "completed" else s.error, 60)),
                Text(_counts(s.keys, "calls")),
            ]
            if self.has_effects:
                row.append(Text(_counts(s.keys, "effects")))
            row.append(verdict)
            table.add_row(*row)
        return table

    def problems(self) -> list[str]:
        """One line per broken promise: the boundary and what went wrong there."""
        return [f"{s.boundary}: {p}" for s in self.violations for p in s.problems]

    def rich_blocks(self) -> Group:
        """The report for a narrow terminal: two or three lines per scenario, the
        boundary whole on the first."""
        lines: list[Text] = [Text(self.summary())]
        for i, s in enumerate((self.baseline, *self.scenarios)):
            style = {"ok": "green", "review": "magenta"}.get(s.verdict, "red")
            head = Text(f"{i:>2}  ")
            head.append("(no crash)" if s.boundary is None else s.boundary.spec, "bold")
            if s.boundary is not None and not s.died:
                head.append("  (did not die here)", "red")
            head.append(f"  {s.status}  ")
            head.append(s.verdict if s.verdict in ("ok", "review") else "VIOLATION", style)
            if s.note and not s.problems:
                head.append(f" ({s.note})")
            lines.append(head)
            counts = f"runs {len(s.exit_codes)}; calls {_counts(s.keys, 'calls') or '-'}"
            if self.has_effects:
                counts += f"; effects {_counts(s.keys, 'effects') or '-'}"
            lines.append(Text(f"    {counts}"))
            result = _preview(s.result if s.status == "completed" else s.error, 60)
            lines.append(Text(f"    result {result}"))
        return Group(*lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        narrow = options.max_width < 120
        yield self.rich_blocks() if narrow else self.rich_table()
        for p in self.problems():
            yield Text.assemble(("violation", "red"), f" at {p}")

    def table(self, width: int = 160) -> str:
        """The report as plain text (no colours): the table, then every violation."""
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, color_system=None, highlight=False)
        console.print(self)
        return buffer.getvalue()

    def __str__(self) -> str:
        return self.table()


def _preview(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _counts(keys: Sequence[KeyCount], field: str) -> str:
    names = collections.Counter(k.step for k in keys)
    parts = []
    for k in keys:
        value = getattr(k, field)
        if value is None or (field == "effects" and value == 0):
            continue
        label = k.step if names[k.step] == 1 else f"{k.step}@{k.seq}"
        parts.append(f"{label or k.key}={value}")
    return " ".join(parts)


# --- running children --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ChildRun:
    """How one child process ended: its exit code (-9 for SIGKILL) and its output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        """Whether it died of SIGKILL."""
        return self.returncode == -9

    def describe(self) -> str:
        """Exit code and the tail of its output, for error messages."""
        return (
            f"child exited {self.returncode}\n--- stdout\n{self.stdout[-2000:]}\n"
            f"--- stderr\n{self.stderr[-4000:]}"
        )


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
    judged = runner.judge(baseline, None, None)
    scenarios = []
    for i, boundary in enumerate(boundaries, start=1):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{i:02d}-{boundary.spec}")
        raw = runner.run(root / name, f"{prefix}-{i}", boundary)
        scenarios.append(runner.judge(raw, boundary, baseline))
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


@dataclasses.dataclass(slots=True)
class _Raw:
    """What a scenario's processes did, before judging."""

    directory: Path
    workflow_id: str
    exits: list[ChildRun]
    status: str
    result: Any
    error: str | None
    journal: dict[int, str]  # seq -> status of step entries
    calls: list[dict[str, Any]]
    effects: dict[str, int] | None
    trace: list[dict[str, Any]]
    review_reason: str | None


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

    def run(self, folder: Path, workflow_id: str, boundary: Boundary | None) -> _Raw:
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
    ) -> _Raw:
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
        return _Raw(
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

    # --- judging -------------------------------------------------------------------

    def judge(self, raw: _Raw, boundary: Boundary | None, baseline: _Raw | None) -> Scenario:
        """Compare one scenario with the uninterrupted run and the steps' policies."""
        problems: list[str] = []
        died = False
        for e in raw.exits:
            if e.returncode not in (0, -9):
                last = (e.stderr.strip().splitlines() or ["no output"])[-1]
                problems.append(f"a process exited {e.returncode}: {last}")
        if boundary is not None:
            died = self._died_at(raw, boundary)
            if not died:
                codes = [e.returncode for e in raw.exits]
                problems.append(f"the process did not die at this boundary (exits {codes})")
        keys = self._keys(raw, baseline)
        policies = {c["step"]: c["policy"] for c in (baseline or raw).calls if "policy" in c}
        policy = policies.get(boundary.step, "") if boundary is not None else ""
        review_expected = (
            boundary is not None
            and policy == "at_most_once"
            and boundary.point in UNKNOWN_OUTCOME_POINTS
        )
        expected = baseline.status if baseline is not None else raw.status
        note = ""
        if review_expected:
            if raw.status != "needs_review":
                problems.append(
                    f"an interrupted at-most-once step must park in needs_review; "
                    f"the workflow is {raw.status}"
                )
            note = "parked, as declared"
        elif raw.status == "needs_review":
            problems.append(f"parked in needs_review ({raw.review_reason})")
        elif raw.status != expected:
            problems.append(f"ended {raw.status}, without a crash it ends {expected}")
        elif baseline is not None and _norm(raw.error or "", raw.workflow_id) != _norm(
            baseline.error or "", baseline.workflow_id
        ):
            problems.append(f"ended with {raw.error!r}, without a crash with {baseline.error!r}")
        for key, step in _reran(raw).items():
            problems.append(f"step {step} ran again after its receipt was committed (key {key})")
        for k in keys:
            if k.calls > k.limit_calls:
                problems.append(
                    f"{k.policy} step {k.step} called {k.calls} times with key {k.key} "
                    f"(allowed {k.limit_calls})"
                )
            if (
                k.effects is not None
                and k.limit_effects is not None
                and k.effects > k.limit_effects
            ):
                problems.append(
                    f"key {k.key} reached the outside {k.effects} times (allowed {k.limit_effects})"
                )
            if (
                k.policy == "reconcile"
                and raw.status == "completed"
                and k.seq is not None
                and raw.journal.get(k.seq) != "completed"
            ):
                problems.append(f"no receipt for reconcile step {k.step} at seq {k.seq}")
        if not problems and boundary is not None and boundary.point in UNKNOWN_OUTCOME_POINTS:
            if policy == "reconcile":
                note = "reconciled"
            elif policy == "plain" and boundary.point == "after_call":
                note = "ran again, same key"
        verdict = "violation" if problems else ("review" if raw.status == "needs_review" else "ok")
        return Scenario(
            boundary,
            raw.workflow_id,
            raw.directory,
            tuple(e.returncode for e in raw.exits),
            died,
            raw.status,
            raw.result,
            raw.error,
            tuple(keys),
            verdict,
            tuple(problems),
            note,
        )

    @staticmethod
    def _died_at(raw: _Raw, boundary: Boundary) -> bool:
        if not raw.exits or not raw.exits[0].killed:
            return False
        if not (raw.directory / CRASH_MARKER).exists() or not raw.trace:
            return False
        first_pid = raw.trace[0]["pid"]
        last = [t for t in raw.trace if t["pid"] == first_pid][-1]
        return Boundary(last["point"], last["step"], int(last["nth"])) == boundary

    def _keys(self, raw: _Raw, baseline: _Raw | None) -> list[KeyCount]:
        base = baseline or raw
        calls = _tally(raw)
        base_calls = _tally(base)
        effects = _normalise(raw.effects, raw.workflow_id)
        base_effects = _normalise(base.effects, base.workflow_id)
        meta: dict[str, dict[str, Any]] = {}
        for source in (base, raw):
            for c in source.calls:
                if c.get("event", "call") == "call":
                    meta.setdefault(_norm(c["key"], source.workflow_id), c)
        ordered = list(
            dict.fromkeys([*base_calls, *calls, *(effects or {}), *(base_effects or {})])
        )
        out = []
        for norm in ordered:
            info = meta.get(norm, {})
            policy = info.get("policy", "unknown")
            extra = 1 if policy in ("plain", "unknown") else 0
            n_base = base_calls.get(norm, 0)
            e_base = None if base_effects is None else base_effects.get(norm, 0)
            out.append(
                KeyCount(
                    key=norm.replace("{wf}", raw.workflow_id),
                    step=info.get("step", ""),
                    seq=info.get("seq"),
                    policy=policy,
                    calls=calls.get(norm, 0),
                    effects=None if effects is None else effects.get(norm, 0),
                    baseline_calls=n_base,
                    baseline_effects=e_base,
                    limit_calls=n_base + extra,
                    limit_effects=None if e_base is None else e_base + extra,
                )
            )
        return out


def _norm(key: str, workflow_id: str) -> str:
    """A key with its scenario's workflow id replaced, so scenarios compare with the baseline."""
    return key.replace(workflow_id, "{wf}")


def _tally(raw: _Raw) -> dict[str, int]:
    calls = (c for c in raw.calls if c.get("event", "call") == "call")
    return dict(collections.Counter(_norm(c["key"], raw.workflow_id) for c in calls))


def _reran(raw: _Raw) -> dict[str, str]:
    """Keys whose step function was called after their receipt was committed: key -> step."""
    done: set[str] = set()
    out: dict[str, str] = {}
    for c in raw.calls:
        if c.get("event") == "receipt":
            done.add(c["key"])
        elif c["key"] in done:
            out.setdefault(c["key"], c["step"])
    return out


def _normalise(counts: Mapping[str, int] | None, workflow_id: str) -> dict[str, int] | None:
    if counts is None:
        return None
    out: dict[str, int] = collections.Counter()
    for key, n in counts.items():
        out[_norm(key, workflow_id)] += n
    return dict(out)


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


# --- the command -------------------------------------------------------------------------


@click.command("test-crashes")
@click.argument("target")
@click.argument("args_json", default="[]")
@click.option(
    "--effects-log",
    default=None,
    help="JSONL log your service writes, one line per request with an idempotency_key "
    "(relative: inside each scenario's DURABLY_SCENARIO_DIR).",
)
@click.option(
    "--workdir", type=click.Path(file_okay=False), default=None, help="Keep scenarios here."
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds per process.")
@click.option(
    "--only",
    multiple=True,
    help="Only boundaries matching this shell pattern, e.g. '*:issue_refund@*' (repeatable).",
)
def test_crashes_command(
    target: str,
    args_json: str,
    effects_log: str | None,
    workdir: str | None,
    timeout: float,
    only: tuple[str, ...],
) -> None:
    """Kill MODULE:WORKFLOW at every commit boundary, recover it, and check its side effects.

    ARGS_JSON is a list of arguments or an object of keywords. Exits 1 when any
    boundary broke a step's declared policy.
    """
    if ":" not in target:
        raise click.UsageError("TARGET must be MODULE:WORKFLOW")
    from durably.cli import parse_args_json  # the CLI registers this command: import late

    args, kwargs = parse_args_json(args_json)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    console = Console(highlight=False)
    try:
        report = crash_points(
            target,
            args,
            kwargs,
            workdir=workdir,
            effects=effects_log,
            timeout=timeout,
            only=list(only) or None,
        )
    except CrashToolError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(report)
    console.print(f"scenarios in {report.workdir}", soft_wrap=True, markup=False)
    if not report.ok:
        sys.exit(1)
