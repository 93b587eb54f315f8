"""What ``crash_points`` found: the boundaries, the scenarios, their verdicts and the report.

The runner (:mod:`durably.testing.crashes`) starts the child processes and
collects what each scenario did into a :class:`Raw`; :func:`judge` compares it
with the uninterrupted run and the steps' declared policies (the rules are in
the runner's docstring), and :class:`CrashReport` shows the verdicts.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

#: The file a scenario's first process creates just before it dies (DURABLY_CRASH_ONCE).
CRASH_MARKER = "crashed"

#: Boundaries where an intent is committed and its receipt is not: the outcome is unknown.
UNKNOWN_OUTCOME_POINTS = frozenset({"after_intent", "before_call", "after_call"})


# --- the report ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """One boundary of the uninterrupted run: the ``nth`` time ``point`` was reached for ``step``.

    ``step`` is the step name (the workflow name for ``before_finish`` and
    ``after_finish``, empty for
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


# --- what a scenario did, and the verdict on it ----------------------------------------


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


@dataclasses.dataclass(slots=True)
class Raw:
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


def judge(raw: Raw, boundary: Boundary | None, baseline: Raw | None) -> Scenario:
    """Compare one scenario with the uninterrupted run and the steps' policies."""
    problems: list[str] = []
    died = False
    for e in raw.exits:
        if e.returncode not in (0, -9):
            last = (e.stderr.strip().splitlines() or ["no output"])[-1]
            problems.append(f"a process exited {e.returncode}: {last}")
    if boundary is not None:
        died = _died_at(raw, boundary)
        if not died:
            codes = [e.returncode for e in raw.exits]
            problems.append(f"the process did not die at this boundary (exits {codes})")
    keys = _keys(raw, baseline)
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
        if k.effects is not None and k.limit_effects is not None and k.effects > k.limit_effects:
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


def _died_at(raw: Raw, boundary: Boundary) -> bool:
    if not raw.exits or not raw.exits[0].killed:
        return False
    if not (raw.directory / CRASH_MARKER).exists() or not raw.trace:
        return False
    first_pid = raw.trace[0]["pid"]
    last = [t for t in raw.trace if t["pid"] == first_pid][-1]
    return Boundary(last["point"], last["step"], int(last["nth"])) == boundary


def _keys(raw: Raw, baseline: Raw | None) -> list[KeyCount]:
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
    ordered = list(dict.fromkeys([*base_calls, *calls, *(effects or {}), *(base_effects or {})]))
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


def _tally(raw: Raw) -> dict[str, int]:
    calls = (c for c in raw.calls if c.get("event", "call") == "call")
    return dict(collections.Counter(_norm(c["key"], raw.workflow_id) for c in calls))


def _reran(raw: Raw) -> dict[str, str]:
    """Keys whose step function was called after their receipt was committed: key -> step.

    A receipt names its call by workflow and seq: a key is not made of the seq in a
    workflow whose tasks ran at once (``step_keys``)."""
    done: set[tuple[Any, Any]] = set()
    out: dict[str, str] = {}
    for c in raw.calls:
        at = (c.get("workflow_id"), c.get("seq"))
        if c.get("event") == "receipt":
            done.add(at)
        elif at in done:
            out.setdefault(c["key"], c["step"])
    return out


def _normalise(counts: Mapping[str, int] | None, workflow_id: str) -> dict[str, int] | None:
    if counts is None:
        return None
    out: dict[str, int] = collections.Counter()
    for key, n in counts.items():
        out[_norm(key, workflow_id)] += n
    return dict(out)
