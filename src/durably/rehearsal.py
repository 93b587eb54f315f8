"""Replaying recorded journals against today's code, with no side effect: the check before a deploy.

``durably replay archive.jsonl --app MODULE`` and :func:`durably.testing.replay`
run each recorded workflow's function, from its first line, under a
:class:`RehearsalRun`: every durable call is matched against the journal as a
recovery would match it (the same :class:`~durably.replay.Replayer`), recorded
results are decoded as a recovery would decode them, and the run stops where
the journal ends. Nothing is written and no step function is called: a step
the journal has no final entry for (a new call, an interrupted one) ends the
rehearsal of that workflow there, and so does any wait that would need the
store (a signal not yet received, a child not yet joined, a timer not yet due).
A cancellation the journal recorded is raised at its seq, as a recovery raises
it, so the cleanup that ran after it is matched too.

A :class:`Problem` is what would stop the workflow if today's code recovered
it: a divergence (the seq, both calls, the line of today's call), a recorded
value that no longer decodes, an error today's code raises where the recorded
run did not fail, a workflow no imported module defines. A step called with
other arguments is a problem under ``strict_replay`` (as for an
``Engine(strict_replay=True)``), else a warning.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from durably import (
    archive,
    codec,
    context,
    errors,
    journal,
    step_threads,
    workflow_run,
    workflows,
)
from durably.storage import bulk, create_store, thread


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """Something that would stop a recorded workflow under today's code."""

    workflow_id: str
    name: str  # the workflow's registered name
    seq: int | None  # the journal position, when one is concerned
    site: str | None  # file:line of today's call there, when known
    message: str

    def line(self) -> str:
        """The problem as one line: id, name, seq (and source line unless the message has
        it), then the message."""
        where = f" seq {self.seq}" if self.seq is not None else ""
        at = f" at {self.site}" if self.site and self.site not in self.message else ""
        return f"{self.workflow_id} ({self.name}){where}{at}: {self.message}"


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """What a rehearsal found: the workflows replayed, their problems and warnings."""

    replayed: tuple[str, ...]
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()
    #: The workflows whose code ran to its end within the journal (the others stopped
    #: where their journal ends: unfinished workflows, or a problem).
    whole: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when today's code can recover every replayed workflow."""
        return not self.problems


class _EndOfJournal(workflow_run.Suspended):
    """The rehearsal reached what the journal does not hold: it stops there."""


class RehearsalRun(workflow_run.Run):
    """A run that replays its journal and stops where it ends; it never writes.

    Only the hooks where a live run would act are replaced: ``lookup`` stops
    at a step without a final entry (a live run would call it), ``write`` and
    ``block`` stop (a live run would commit or wait), ``cancel_point`` delivers
    nothing new (a journaled cancellation is raised at its seq, as a live replay
    raises it), and a changed argument is collected instead of noted on the row.
    """

    def __init__(
        self,
        services: workflow_run.Services,
        info: journal.WorkflowInfo,
        history: list[journal.Entry],
        definition: workflows.WorkflowDefinition,
    ) -> None:
        super().__init__(services, info, history, definition.version, definition.source_hash)
        self.changed: list[errors.ArgumentsChanged] = []
        self.at: tuple[int, str | None] | None = None  # the last call matched: seq, site
        self.reached_end = False  # the code returned (or raised) within the journal

    def lookup(self, seq: int, kind: str, name: str) -> journal.Entry | None:
        entry = self.recorded(seq, kind, name)  # raises NonDeterminismError on another call
        self.at = (seq, self.call_site(seq))
        if entry is None:
            raise _EndOfJournal(f"the journal ends at seq {seq}")
        if entry.kind == journal.Kind.CANCEL:  # raised here as a live replay raises it (no
            return super().lookup(seq, kind, name)  # write): the cleanup after it replays too
        if entry.kind == journal.Kind.STEP and entry.status not in journal.FINAL_ENTRY_STATUSES:
            raise _EndOfJournal(f"the step at seq {seq} has no recorded outcome")
        return entry

    async def write(self, verb: workflow_run.Verb, *args: Any, **kwargs: Any) -> Any:
        raise _EndOfJournal(f"{verb}: a live run would write here")

    async def block(
        self, kind: str, key: str, wake_at: float | None, since: int | None = None
    ) -> None:
        raise _EndOfJournal(f"a live run would wait for {kind} {key!r} here")

    def cancel_point(self, seq: int, kind: str, name: str) -> None:
        """No cancellation is delivered in a rehearsal (a journaled one ends it)."""

    async def warn(self, changed: errors.ArgumentsChanged) -> None:
        self.changed.append(changed)


async def rehearse(
    recorded: Iterable[bulk.ArchivedWorkflow], *, strict_replay: bool = False
) -> Report:
    """Replay each recorded workflow against the code registered in this process."""
    threads = step_threads.StepThreads(1)  # never used (it starts no thread): no step runs
    services = workflow_run.Services(
        store=cast(thread.StoreThread, None),  # never used: a rehearsal writes nothing
        clock=time.time,
        step_threads=threads,
        stopping=asyncio.Event(),
        strict_replay=strict_replay,
    )
    replayed: list[str] = []
    whole: list[str] = []
    problems: list[Problem] = []
    warnings: list[Problem] = []
    try:
        for wf in recorded:
            info, history = _rows(wf)
            replayed.append(info.workflow_id)
            definition = workflows.registered(info.name)
            if definition is None:
                problems.append(
                    Problem(
                        info.workflow_id,
                        info.name,
                        None,
                        None,
                        f"no workflow named {info.name!r} is defined by the imported code "
                        f"(defined: {', '.join(workflows.registered_names()) or 'none'})",
                    )
                )
                continue
            run = RehearsalRun(services, info, history, definition)
            task = asyncio.get_running_loop().create_task(
                _replay_one(run, info, definition), context=contextvars.Context()
            )
            problem = await task
            if problem is not None:
                problems.append(problem)
            elif run.reached_end:
                whole.append(info.workflow_id)
            warnings.extend(_problem(info, c, run) for c in run.changed)
    finally:
        threads.shutdown()
    return Report(tuple(replayed), tuple(problems), tuple(warnings), tuple(whole))


async def _replay_one(
    run: RehearsalRun, info: journal.WorkflowInfo, definition: workflows.WorkflowDefinition
) -> Problem | None:
    context.current_run.set(run)
    run.bind_task()
    try:
        call = codec.decode(info.input, where=f"workflow {info.workflow_id!r} input")
        if not isinstance(call, dict):
            raise errors.DecodeError(
                f"workflow {info.workflow_id!r} input is not an argument record"
            )
        await definition.fn(*call["args"], **call["kwargs"])
        if not (run.compensations and info.status == journal.Status.CANCELLED):
            run.check_finished()  # a cancelled one's compensations follow, as after a raise
        run.reached_end = True
    except workflow_run.Suspended:
        pass  # the journal ends here (or a wait needs the store): all of it replayed
    except errors.NonDeterminismError as exc:
        return _problem(info, exc, run)
    except Exception as exc:
        if run.diverged is not None:  # caught by the code, re-raised as something else
            return _problem(info, run.diverged, run)
        run.reached_end = True
        if isinstance(exc, errors.Cancelled) and run.cancellation.delivered:
            return None  # the journal's own cancellation, raised on: as the recorded run did
        if isinstance(exc, errors.DecodeError) or info.status not in _MAY_RAISE:
            seq, site = run.at or (None, None)
            what = (
                "cannot decode a recorded value"
                if isinstance(exc, errors.DecodeError)
                else (f"raised where the recorded run ended {info.status}")
            )
            return Problem(
                info.workflow_id, info.name, seq, site, f"{what}: {type(exc).__name__}: {exc}"
            )
    finally:
        run.retire()
    return None


def _problem(
    info: journal.WorkflowInfo, exc: errors.NonDeterminismError, run: RehearsalRun
) -> Problem:
    """The problem an error of replay stands for; its line is the call's, where known."""
    site = exc.site or run.call_site(exc.seq)
    return Problem(info.workflow_id, info.name, exc.seq, site, str(exc))


#: Recorded ends after which today's code raising is no news.
_MAY_RAISE = frozenset({journal.Status.FAILED, journal.Status.CANCELLED})

_INFO_FIELDS = frozenset(f.name for f in dataclasses.fields(journal.WorkflowInfo))
_ENTRY_FIELDS = frozenset(f.name for f in dataclasses.fields(journal.Entry))


def _rows(wf: bulk.ArchivedWorkflow) -> tuple[journal.WorkflowInfo, list[journal.Entry]]:
    """The workflow's row and journal from its archived rows."""
    row = wf.rows["workflows"][0]
    info = journal.WorkflowInfo(**{k: v for k, v in row.items() if k in _INFO_FIELDS})
    history = [
        journal.Entry(**{k: v for k, v in r.items() if k in _ENTRY_FIELDS})
        for r in sorted(wf.rows["journal"], key=lambda r: int(r["seq"]))
    ]
    return info, history


# --- where the recorded workflows come from ------------------------------------------


def from_archive(path: str | Path) -> list[bulk.ArchivedWorkflow]:
    """The workflows of an archive written by ``durably export`` (every line checked)."""
    with open(path, encoding="utf-8") as f:
        _, found = archive.read(f, str(path))
    return found


def from_database(
    url: str, status: str | None = None, ids: Sequence[str] = ()
) -> list[bulk.ArchivedWorkflow]:
    """The workflows a live database holds (``ids``, else those of ``status``, else all),
    read in one transaction each batch; nothing is written, nor a database created."""
    runner = thread.StoreThread(create_store(url, create=False))
    runner.start()
    try:
        store = runner.store
        chosen = list(ids) or runner.call_sync(store.export_ids, status, None, write=False)
        if not chosen:
            return []
        found: list[bulk.ArchivedWorkflow] = runner.call_sync(
            store.export_workflows, chosen, write=False
        )
        return found
    finally:
        runner.stop()
