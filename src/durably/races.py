"""Deterministic races in workflow code: ``durably.wait`` and ``durably.wait_first``.

``asyncio.wait(..., return_when=FIRST_COMPLETED)`` answers with what happened
to finish first *in this run*. durably replays a workflow after every park and
every crash, and on a replay every awaitable whose outcome is journaled
finishes at once: the first run saw one done, the replay sees two, and the
code after the wait takes another path. ``durably.wait`` journals which of the
awaitables had finished (their indices) and, on a replay, waits for exactly
those and returns the same done set; ``durably.wait_first`` journals the
winner.

The plain ``asyncio.wait`` with ``FIRST_COMPLETED`` or ``FIRST_EXCEPTION``
over durable calls (a task or coroutine of a step call, ``sleep``,
``wait_for_signal``, a child's ``result()``, ``get_event``, ``send_signal``)
is refused in workflow code (:class:`~durably.errors.NondeterministicWait`,
naming ``durably.wait``), checked when it is called, not when a replay happens
to differ: it is wrong on the first run already, however rarely it shows, and
a refusal at the call names the fix where it is needed. Making it durable
behind the user's back was the other choice, rejected because a durable call
takes a seq: an ``asyncio.wait`` that silently became one would shift the
seqs of every journal written before, and the journal should show every
durable call the code makes. The check looks only at what is awaited:
libraries run inside workflows (pydantic-ai, the OpenAI Agents SDK) race their
own queues and tasks with ``FIRST_COMPLETED``, and stay allowed; so does a
coroutine of the user's own that makes durable calls inside (not recognised:
use ``durably.wait`` for it). ``asyncio.wait`` outside workflow code (and
inside steps) is untouched; the check is installed when the first workflow
runs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import types
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from durably import context, errors, faults, journal

if TYPE_CHECKING:
    from durably.workflow_run import Run

FIRST_COMPLETED = asyncio.FIRST_COMPLETED
FIRST_EXCEPTION = asyncio.FIRST_EXCEPTION
ALL_COMPLETED = asyncio.ALL_COMPLETED
_WHEN = (FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED)
#: The name of a ``wait_first`` entry (a ``wait`` entry is named by its ``return_when``).
FIRST = "wait_first"

#: The asyncio.wait durably itself calls (never the guard below).
_asyncio_wait = asyncio.wait

Done = tuple[set[asyncio.Future[Any]], set[asyncio.Future[Any]]]


def wait(
    aws: Iterable[Awaitable[Any]], *, return_when: str = ALL_COMPLETED
) -> Coroutine[Any, Any, Done]:
    """``asyncio.wait`` for workflow code: ``(done, pending)`` sets of futures, journaled.

    ``aws`` are awaitables (step calls, ``wait_for_signal``, ``sleep``, a
    child's ``result()``, tasks); coroutines are wrapped in tasks, and tasks or
    futures given come back as they are. ``return_when`` is ``asyncio``'s
    (``FIRST_COMPLETED``, ``FIRST_EXCEPTION`` or ``ALL_COMPLETED``). Which of
    them had finished is committed before this returns; a replay waits for
    those and returns the same done set (its futures hold the same results,
    read from the journal). The pending ones keep running, as with asyncio.
    There is no ``timeout``: a wall-clock timeout would not survive a park;
    race a ``durably.sleep(...)`` among ``aws`` instead.
    """
    run = context.require_run("wait")
    given = _check(aws, return_when, "wait")
    return _wait(run, run.take_seq(kind=journal.Kind.WAIT, name=return_when), given, return_when)


def wait_first(*aws: Awaitable[Any]) -> Coroutine[Any, Any, tuple[int, Any]]:
    """Run the awaitables and return ``(index, result)`` of the first to finish, journaled.

    If it raised, its error is raised here. The others are cancelled (the
    caller holds no handle to them); a replay runs only the recorded winner,
    so a loser's step never runs again, whatever a crash cut short. As in
    DBOS's ``wait_first`` and Temporal's ``workflow.wait``, but the winner is
    the journal's, not the moment's.

    A loser should be one durable call (a step, a wait, a child's result): a
    coroutine that makes several may be cut at a different call on a replay.
    Losers that finished in the same instant as the winner are dropped with
    their results (the lowest index wins): to keep every result, use
    ``durably.wait``. A losing ``wait_for_signal`` gives back the signal it
    took, in the transaction that journals the winner: the next wait for that
    name receives it, as if the loser had never looked (signals keep their
    order). That holds for the coroutine given here; a task given is the
    caller's, and what it received stays its result.
    """
    run = context.require_run("wait_first")
    given = _check(aws, FIRST_COMPLETED, "wait_first")
    return _wait_first(run, run.take_seq(kind=journal.Kind.WAIT, name=FIRST), given)


def _check(aws: Iterable[Awaitable[Any]], return_when: str, what: str) -> list[Awaitable[Any]]:
    if return_when not in _WHEN:
        raise ValueError(f"durably.{what}(return_when={return_when!r}): use one of {_WHEN}")
    given = list(aws)
    if not given:
        raise ValueError(f"durably.{what}() needs at least one awaitable")
    for i, aw in enumerate(given):
        if not isinstance(aw, Awaitable):
            raise TypeError(f"durably.{what}(): argument {i} is {aw!r}, not an awaitable")
    return given


async def _wait(run: Run, seq: int, given: list[Awaitable[Any]], return_when: str) -> Done:
    entry = _lookup(run, seq, return_when, given)
    recorded = None if entry is None else _recorded(run, entry, given)
    futures = [asyncio.ensure_future(aw) for aw in given]
    if recorded is not None:
        done = recorded
        await _settled(futures, [futures[i] for i in done])
    else:
        await _settled(futures, None, return_when)
        done = [i for i, f in enumerate(futures) if f.done()]
        await _commit(run, seq, return_when, len(futures), done)
    chosen = set(done)
    return (
        {f for i, f in enumerate(futures) if i in chosen},
        {f for i, f in enumerate(futures) if i not in chosen},
    )


async def _wait_first(run: Run, seq: int, given: list[Awaitable[Any]]) -> tuple[int, Any]:
    entry = _lookup(run, seq, FIRST, given)
    if entry is not None:  # a replay: only the winner runs; the losers never start
        (winner,) = _recorded(run, entry, given)
        for i, aw in enumerate(given):
            if i != winner:
                _discard(aw)
        future = asyncio.ensure_future(given[winner])
        await _settled([future], [future])
    else:
        waits = [_signal_wait(aw) for aw in given]  # read before they run
        futures = [asyncio.ensure_future(aw) for aw in given]
        await _settled(futures, None, FIRST_COMPLETED)
        winner = min(i for i, f in enumerate(futures) if f.done())
        future = futures[winner]
        losers = [f for f in futures if f is not future]
        for loser in losers:
            loser.cancel()
        taken = [w for i, w in enumerate(waits) if w is not None and i != winner]
        try:
            await _commit(run, seq, FIRST, len(futures), [winner], taken)
        finally:
            await asyncio.gather(*losers, return_exceptions=True)
    return winner, future.result()


async def _settled(
    futures: Sequence[asyncio.Future[Any]],
    chosen: Sequence[asyncio.Future[Any]] | None,
    return_when: str = ALL_COMPLETED,
) -> None:
    """Wait until ``chosen`` (a replay's recorded done set) or, on a first run, the
    ``return_when`` condition holds; a branch that let go of the run ends the wait.

    A future that ended with a BaseException that is no error of the workflow's
    (the run parked, was suspended or abandoned) is raised as it is, after the
    futures still running are cancelled: nothing is journaled for such a wait.
    """
    awaited = futures if chosen is None else chosen
    try:
        if awaited:
            await _asyncio_wait(awaited, return_when=return_when)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    for future in futures:
        if future.done() and not future.cancelled():
            exc = future.exception()
            if exc is not None and not isinstance(exc, Exception):
                for other in futures:
                    other.cancel()
                raise exc


def _lookup(run: Run, seq: int, name: str, given: list[Awaitable[Any]]) -> journal.Entry | None:
    """The wait's entry; the awaitables are dropped unrun if the lookup raises (a
    cancellation delivered here, a divergence)."""
    try:
        return run.lookup(seq, journal.Kind.WAIT, name)
    except BaseException:
        for aw in given:
            _discard(aw)
        raise


def _recorded(run: Run, entry: journal.Entry, given: list[Awaitable[Any]]) -> list[int]:
    """The indices a wait's entry recorded as done; NonDeterminismError (the awaitables
    dropped unrun) when the code now waits on another number of awaitables."""
    data = json.loads(entry.payload or "{}")
    recorded, done = int(data.get("count", -1)), [int(i) for i in data.get("done", [])]
    count = len(given)
    if recorded != count:
        for aw in given:
            _discard(aw)
        raise run.diverge(
            errors.NonDeterminismError(
                run.workflow_id,
                entry.seq,
                f"{entry.describe()} over {recorded} awaitables",
                f"{entry.describe()} over {count}",
            )
        )
    return done


async def _commit(
    run: Run,
    seq: int,
    name: str,
    count: int,
    done: list[int],
    taken: Sequence[tuple[int, str]] = (),
) -> None:
    """Journal which awaitables were done: committed before the code can act on a race's
    outcome; staged (committed with the next write) for ALL_COMPLETED, which a replay
    repeats anyway. ``taken``: the losing signal waits of a ``wait_first``, (seq, name),
    whose signals the commit gives back (``Run.commit``)."""
    if run.diverged is not None:
        raise run.diverged
    now = run.clock()
    payload = json.dumps({"count": count, "done": done}, separators=(",", ":"))
    entry = journal.Entry(
        seq, journal.Kind.WAIT, name, journal.EntryStatus.COMPLETED, 1, payload, now, now
    )
    if name == ALL_COMPLETED:  # nothing raced: a replay finds the same; no commit
        run.stage(entry)
        return
    faults.reached("before_wait", name)
    await run.commit(entry, given_back=taken)
    faults.reached("after_wait", name)


def _signal_wait(aw: Awaitable[Any]) -> tuple[int, str] | None:
    """The seq and signal name of ``aw`` when it is the coroutine of a signal wait
    (``receives``), read from its arguments; None for anything else. A task is not read:
    the caller started it and holds it, and what it received is its result."""
    if isinstance(aw, types.CoroutineType) and aw.cr_code in _RECEIVES:
        args = inspect.getcoroutinelocals(aw)
        return int(args["seq"]), str(args["name"])
    return None


def _discard(aw: Awaitable[Any]) -> None:
    """Drop an awaitable that must not run (a loser on a replay), without a warning."""
    if isinstance(aw, Coroutine):
        aw.close()
    elif isinstance(aw, asyncio.Future):
        aw.cancel()


# --- the plain asyncio.wait in workflow code --------------------------------------------


async def _guarded_wait(
    fs: Iterable[Any], *, timeout: float | None = None, return_when: str = ALL_COMPLETED
) -> Any:
    """``asyncio.wait``, refusing a first-to-finish race over durable calls in workflow
    code (see the module's docstring)."""
    if return_when != ALL_COMPLETED and _in_workflow_code():
        fs = list(fs)
        if any(_is_durable_call(f) for f in fs):
            raise errors.NondeterministicWait(
                f"asyncio.wait(return_when={return_when}) over durable calls was called in "
                "workflow code; which one finishes first differs when the workflow is "
                f"replayed. Use durably.wait(aws, return_when=asyncio.{return_when}) or "
                "durably.wait_first(...), which journal the outcome"
            )
    return await _asyncio_wait(fs, timeout=timeout, return_when=return_when)


def _in_workflow_code() -> bool:
    return context.current_run.get() is not None and context.current_step.get() is None


def _is_durable_call(aw: object) -> bool:
    """Whether ``aw`` is (a task of) the coroutine of a durable call."""
    coro = aw.get_coro() if isinstance(aw, asyncio.Task) else aw
    return getattr(coro, "cr_code", None) in _DURABLE_CALLS


#: The code of the coroutine functions marked with ``durable_call``.
_DURABLE_CALLS: set[Any] = set()

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def durable_call(fn: F) -> F:
    """Mark ``fn`` as the coroutine function behind one durable call (a step's run, a
    timer, a signal wait, a join, a message), so that ``asyncio.wait``'s check in
    workflow code recognises its coroutines and tasks. Returns ``fn`` itself."""
    _DURABLE_CALLS.add(fn.__code__)
    return fn


#: The code of the durable calls that take a signal from the workflow's queue (``receives``).
_RECEIVES: set[Any] = set()


def receives(fn: F) -> F:
    """``durable_call`` for a signal wait: a coroutine function whose ``seq`` and ``name``
    arguments are its entry's seq and the signal's name. A ``wait_first`` gives back the
    signal such a wait took when it loses (``_signal_wait``). Returns ``fn`` itself."""
    _RECEIVES.add(fn.__code__)
    return durable_call(fn)


durable_call(_wait)
durable_call(_wait_first)


def guard_asyncio_wait() -> None:
    """Install the check on ``asyncio.wait`` (idempotent; once per process is enough)."""
    if asyncio.wait is not _guarded_wait:
        asyncio.wait = _guarded_wait
