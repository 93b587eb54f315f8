"""Who serves what: why an unfinished workflow may not move.

Each engine registers the workflows it has the code of (name, version and
source hash) and the queues it serves (see ``ExecutorInfo``). From that, and
from the source hash stored when a workflow started, :func:`notes` says what
stands in a workflow's way: no running worker has its code, none serves its
queue, or the workers run other code than the code that started it (two
applications sharing a database, or a deploy that changed the function).
The engine logs these (once per workflow) and ``durably list`` and ``show``
print them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from durably import journal

#: An executor whose last heartbeat is older than this is not counted as running. Engines
#: beat every lease / 3 (10 s by default); a dead one is removed on the next recovery pass
#: of an engine on its host, or after ten leases by any engine.
LIVE_SECONDS = 120.0


def running(executors: Sequence[journal.ExecutorInfo], now: float) -> list[journal.ExecutorInfo]:
    """The executors that beat recently."""
    return [e for e in executors if e.heartbeat_at >= now - LIVE_SECONDS]


def code_differs(started: str | None, here: str | None) -> bool:
    """Whether two known source hashes of a workflow differ (unknown matches anything)."""
    return started is not None and here is not None and started != here


def describe(name: str, version: str | None) -> str:
    return repr(name) + (f" version {version!r}" if version else "")


def stranded(
    info: journal.WorkflowInfo, executors: Sequence[journal.ExecutorInfo], now: float
) -> Note | None:
    """Why no running code can resume an unfinished workflow, and what to do; None if some can.

    Stranded: no running executor registers its workflow name at its version (a
    versioned workflow is resumed only by code declaring the same version; an
    unversioned one by code registering the name without a version).
    """
    if info.finished:
        return None
    live = running(executors, now)
    if any(e.serves(info.name, info.version) for e in live):
        return None
    wanted = describe(info.name, info.version)
    others = sorted({v or "" for e in live for n, v, _ in e.workflows if n == info.name})
    text = f"no running worker has workflow {wanted}"
    if others:
        shown = ", ".join(f"version {v!r}" if v else "no version" for v in others)
        text += f" (running workers have it at {shown})"
    if info.source_hash:
        text += f"; it started on source {info.source_hash}"
    if info.version:
        todo = (
            f"run a worker whose code declares @durably.workflow(name={info.name!r}, "
            f"version={info.version!r}) (keep that version deployed until its workflows finish)"
        )
    else:
        todo = f"run a worker whose code registers workflow {info.name!r} without a version"
        if others:  # started by name from a process without the code: it got no version
            todo += (
                " (a workflow started by name from a process that does not import its code "
                "gets no version: start it from code that has the versioned workflow)"
            )
    return Note(
        "stranded",
        f"{text}. To finish it: {todo}; or give it up: durably cancel {info.workflow_id}",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Note:
    """One thing in a workflow's way: a short ``tag`` for a table, the ``text`` in full."""

    tag: str
    text: str


def notes(
    info: journal.WorkflowInfo, executors: Sequence[journal.ExecutorInfo], now: float
) -> list[Note]:
    """What stands in the way of an unfinished workflow (nothing for a finished one)."""
    if info.finished:
        return []
    live = running(executors, now)
    serving = [e for e in live if e.serves(info.name, info.version)]
    found: list[Note] = []
    if not serving:
        text = f"no running worker has workflow {describe(info.name, info.version)}"
        found.append(Note("no worker", text))
    elif info.queue is not None and not any(info.queue in e.queues for e in serving):
        text = f"no running worker with its code serves queue {info.queue!r}"
        found.append(Note("no queue", text))
    owner = next((e for e in live if e.executor_id == info.owner), None)
    deciding = [owner] if owner is not None else serving
    hashes = {e.source_hash_of(info.name, info.version) for e in deciding}
    if hashes and all(code_differs(info.source_hash, h) for h in hashes):
        where = "runs on" if owner is not None else "workers have"
        others = ", ".join(sorted(h for h in hashes if h is not None))
        text = (
            f"other code: started by source {info.source_hash}, {where} {others} (its "
            "code changed since it started, or another application shares the database)"
        )
        found.append(Note("other code", text))
    return found
