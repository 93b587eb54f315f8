"""Driving one workflow run from its first line to its end, park or suspension.

The engine hands a claimed workflow here. The driver replays it against its
journal, records how it ended (completed, failed, cancelled, diverged), and
leaves the row alone when the run parked, was suspended by a stopping engine,
or lost its lease.
"""

from __future__ import annotations

import logging

from durably import (
    cancellation,
    codec,
    context,
    errors,
    faults,
    journal,
    races,
    run_types,
    step_call,
    steps,
    telemetry,
    workflow_run,
    workflows,
)

log = logging.getLogger("durably")


async def drive(
    run: workflow_run.Run,
    info: journal.WorkflowInfo,
    definition: workflows.WorkflowDefinition,
    history: list[journal.Entry],
    max_recoveries: int,
) -> None:
    """Run the workflow function under ``run`` and record its end (one telemetry segment)."""
    with telemetry.workflow_span(run, definition.name, len(history), info.crash_count):
        await _drive(run, info, definition, history, max_recoveries)


async def _drive(
    run: workflow_run.Run,
    info: journal.WorkflowInfo,
    definition: workflows.WorkflowDefinition,
    history: list[journal.Entry],
    max_recoveries: int,
) -> None:
    wid = info.workflow_id
    try:
        if info.crash_count > max_recoveries:
            await run.finish(journal.Status.FAILED, None, _poison(info, history, max_recoveries))
            return
        if not history and run.cancellation.due:  # asked to stop before its code ever ran
            unstarted = cancellation.cancelled(
                wid, "before it started", info.deadline_at, run.clock()
            )
            await run.finish(journal.Status.CANCELLED, None, error_payload(unstarted))
            return
        call = codec.decode(info.input, where=f"workflow {wid!r} input")
        if not isinstance(call, dict):
            raise errors.DecodeError(f"workflow {wid!r} input is not an argument record")
        races.guard_asyncio_wait()
        context.current_run.set(run)
        run.bind_task()
        result = await definition.fn(*call["args"], **call["kwargs"])
        await run.close()  # a branch the function did not await may still run a step
        await run.settle()
        if run.parked or run.suspended:  # the code went on past a Suspended it swallowed
            log.info("workflow %s returned after it let go: it ends when replayed", wid)
            return
        if run.compensations and await run.cancel_asked():  # it returned, but is cancelled
            await _compensate_returned(run, definition, result)
            return
        run.check_finished()
        output = _output(definition, wid, result)
        faults.reached("before_finish", definition.name)
        try:
            await run.finish(journal.Status.COMPLETED, output, None)
        except errors.StorageDataError as refused:  # it fails instead (the except below)
            raise errors.StorageDataError(
                f"workflow {definition.name!r} ({wid!r}): its result cannot be stored: {refused}"
            ) from refused
    except workflow_run.Suspended:
        await run.close()  # steps of other branches finish and commit first
        log.info("workflow %s let go (%s)", wid, "parked" if run.parked else "suspended")
    except workflow_run.Abandoned as exc:
        log.error("workflow %s stopped: %s; it resumes from its journal", wid, exc)
    except errors.FencedError as exc:
        log.warning("workflow %s: %s", wid, exc)
    except Exception as exc:
        await run.close()  # a failing branch must not strand its siblings' steps
        await run.settle()
        if run.parked or run.suspended:  # the error may come from a swallowed Suspended
            log.info("workflow %s raised after it let go (%r): it is replayed", wid, exc)
            return
        run.compensate_here()  # compensations run here; other branches stay stopped
        await _fail(run, exc)
    finally:
        run.retire()


async def _compensate_returned(
    run: workflow_run.Run, definition: workflows.WorkflowDefinition, result: object
) -> None:
    """End ``cancelled`` a workflow whose function returned after its cancel (it caught
    ``Cancelled``, or the cancel came after its last durable call): its compensations
    run first, as for one that raised it, and its result is kept in ``output``.

    A cancel not delivered yet is journaled at the next seq, as a durable call there
    would have, so a replay runs the compensations from the journal and ``resume``
    sees steps after the cancellation.
    """
    run.compensate_here()
    output = _output(definition, run.workflow_id, result)
    cause: errors.Cancelled | None = None
    if not run.cancellation.delivered:
        run.cancellation.requested = True
        seq = run.take_seq(kind=journal.Kind.CANCEL)
        try:
            run.lookup(seq, journal.Kind.CANCEL, "")  # raises: delivered here, or replayed
        except errors.Cancelled as exc:
            cause = exc
    if cause is None:
        cause = cancellation.cancelled(
            run.workflow_id, "and its function returned", run.cancellation.deadline, run.clock()
        )
    try:
        await _compensate(run, cause)
    except (workflow_run.Suspended, workflow_run.Abandoned, errors.FencedError) as stop:
        log.warning("workflow %s: compensation interrupted: %s", run.workflow_id, stop)
        return  # it resumes from its journal; finished compensations won't run again
    run.check_finished()  # nothing journaled after the compensations
    faults.reached("before_finish", definition.name)
    await run.finish(journal.Status.CANCELLED, output, error_payload(cause))


def _output(definition: workflows.WorkflowDefinition, wid: str, result: object) -> str:
    """The workflow function's result as the JSON text of its row's ``output``."""
    return codec.encode(result, where=f"workflow {definition.name!r} ({wid!r}) result")


def _poison(info: journal.WorkflowInfo, history: list[journal.Entry], limit: int) -> str:
    last = f"{history[-1].describe()} at seq {history[-1].seq}" if history else "its start"
    return error_payload(
        errors.WorkflowFailed(
            f"workflow {info.workflow_id!r} crashed its executor {info.crash_count} times "
            f"in a row without progress (limit {limit}); the last journal entry is {last}"
        )
    )


async def _fail(run: workflow_run.Run, exc: Exception) -> None:
    diverged = run.diverged
    status: str
    err: BaseException
    if diverged is not None or isinstance(exc, errors.NonDeterminismError):
        status, err = journal.Status.DIVERGED, diverged or exc
        log.error("workflow %s diverged: %s", run.workflow_id, err)
    elif isinstance(exc, errors.Cancelled) and run.cancellation.delivered:
        status, err = journal.Status.CANCELLED, exc
    else:
        status, err = journal.Status.FAILED, exc
    if status != journal.Status.DIVERGED and run.compensations:
        try:
            await _compensate(run, err)
        except (workflow_run.Suspended, workflow_run.Abandoned, errors.FencedError) as stop:
            log.warning("workflow %s: compensation interrupted: %s", run.workflow_id, stop)
            return  # it resumes from its journal; finished compensations won't run again
    try:
        await _record_end(run, status, err)
    except (workflow_run.Abandoned, workflow_run.Suspended, errors.FencedError) as store_exc:
        log.error("could not record the end of workflow %s: %s", run.workflow_id, store_exc)


async def _record_end(run: workflow_run.Run, status: str, err: BaseException) -> None:
    """Record the workflow's end with its error, even when the database refuses the error.

    Refused (``StorageDataError``: a LATIN1 database, a constraint), the error is
    written again with its text ASCII-escaped (it decodes to the same text), and
    failing that as a ``WorkflowFailed`` that says so (the refusal is logged): a
    workflow that failed must not stay ``running`` and be run again.
    """
    try:
        await run.finish(status, None, error_payload(err))
        return
    except errors.StorageDataError as exc:
        refused = exc
    log.error("workflow %s: the database refused its error: %s", run.workflow_id, refused)
    try:
        await run.finish(status, None, step_call.error_json(err, ascii_only=True))
        return
    except errors.StorageDataError:
        pass
    fallback = errors.WorkflowFailed(  # none of the refused text: the refusal may quote it
        f"workflow {run.workflow_id!r} ended {status} with {type(err).__name__}, and the "
        "database refused to store its text (see the log)"
    )
    await run.finish(status, None, step_call.error_json(fallback, ascii_only=True))


async def _compensate(run: workflow_run.Run, cause: BaseException) -> None:
    """Run the registered undos as durable steps, newest first; note the ones that failed."""
    run.cancellation.delivered = True  # compensations run even when cancellation was asked
    # by the call each was registered after (stable: in one task, registration order),
    # not by registration: branches of a gather register in another order on a replay
    for undo in sorted(run.compensations, key=run_types.Compensation.order, reverse=True):
        try:
            await steps.run_step(undo.fn, *undo.args, name=undo.name, **undo.kwargs)
        except Exception as exc:
            note = f"compensation {undo.name} failed: {type(exc).__name__}: {exc}"
            cause.add_note(f"[durably] {note}")
            log.error("workflow %s: %s", run.workflow_id, note)


def error_payload(exc: BaseException) -> str:
    """An exception as the JSON text stored in a workflow's error column."""
    return codec.encode(codec.encode_error(exc), where="workflow error")
