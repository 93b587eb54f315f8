"""Running one step under the commit protocol of DESIGN.md.

1. Look the call up in the journal: a receipt is returned, a final error
   re-raised, a pending retry waited out.
2. Only for ``reconcile=`` or ``at_most_once=`` steps, commit the intent.
3. Call the function (a sync one in a thread), with its idempotency key.
4. Commit the receipt, or the failed attempt, fenced by the lease epoch; only
   then return to the workflow.

An intent found without a receipt means the outcome is unknown: reconcile asks
the outside world, at-most-once parks the workflow for a person to decide.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import json
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from durably import (
    codec,
    context,
    declared,
    errors,
    faults,
    journal,
    races,
    replay,
    step_threads,
    steps,
    telemetry,
    watchdog,
    workflow_run,
)
from durably.storage import thread

if TYPE_CHECKING:
    from durably.workflow_run import Run

_STEP = journal.Kind.STEP
_S = journal.EntryStatus
_A = replay.Action
_RUN = replay.Action.RUN

REVIEW = workflow_run.REVIEW


@races.durable_call
async def run_step(
    run: Run,
    seq: int,
    step: steps.StepDefinition,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    digest: str | None,
    key: str,
) -> Any:
    """The awaitable behind a step call whose seq and key were taken at the call;
    ``digest``: its arguments', as its entries carry it (``step_keys``)."""
    with run.active():
        return await _run(run, seq, step, args, kwargs, digest, key)


async def _run(
    run: Run,
    seq: int,
    step: steps.StepDefinition,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    digest: str | None,
    key: str,
) -> Any:
    pokes = run.pokes  # a back-off replayed here re-checks a wake-up from its look on
    entry = run.lookup(seq, _STEP, step.name)
    plan = replay.plan_step(entry, reconciles=step.reconcile is not None)
    action, attempt = plan.action, plan.attempt
    where = f"step {step.name!r} (workflow {run.workflow_id!r}, seq {seq})"
    if entry is not None and digest != entry.args_digest:  # a replay with other arguments?
        await run.check_arguments(seq, entry, digest)
    if action is not _RUN:
        assert entry is not None  # a new call always runs
        if action is _A.RETURN:
            return recorded_result(run, seq, step, entry.payload or "null", where)
        if action is _A.RAISE:
            raise recorded_error(entry, where)
        if action is _A.BACKOFF:
            assert plan.wake_at is not None
            await _backoff(run, seq, step.name, plan.wake_at, pokes)
        else:  # an intent without a receipt: the outcome is unknown
            found = await _unknown_outcome(run, seq, step, entry, args, kwargs, key, where)
            if found is not None:
                return found[0]
            run.cancel_point(seq, _STEP, step.name)  # it did not happen: a cancel may end it
    if run.must_flush():  # what the step could observe is committed before it runs
        await run.flush_observed()
    while True:
        if not run.ready_now():  # not while a park is on its way: the run may be letting go
            await run.ready()
        run.check_stopping()
        if step.needs_intent:
            faults.reached("before_intent", step.name)
            intent = _entry(
                run,
                seq,
                step,
                _S.STARTED,
                attempt,
                _intent(args, kwargs, key, where),
                digest=digest,
            )
            await run.commit(intent)
            faults.reached("after_intent", step.name)
        faults.reached("before_call", step.name)
        started = run.clock()
        ctx = context.StepContext(run.workflow_id, seq, step.name, attempt, key)
        try:
            with telemetry.step_span(run.workflow_id, seq, step.name, attempt):
                result = await invoke(run, step, args, kwargs, ctx)
            # a result that cannot be stored fails this attempt like any error of the step
            payload = codec.encode(result, where=f"{where} result")
        except Exception as exc:
            finished = run.clock()
            delay = step.retry.delay_after(attempt, exc) if step.retry else None
            status = _S.FAILED if delay is None else _S.RETRYING
            wake = None if delay is None else finished + delay
            error = error_json(exc)
            failure = _entry(
                run, seq, step, status, attempt, error, started, finished, wake, digest
            )
            pokes = run.pokes  # a cancel asked while the attempt commits ends the back-off
            await _commit_failure(run, failure, exc, where)
            if delay is None:
                raise
            faults.reached("in_backoff", step.name)
            await _backoff(run, seq, step.name, finished + delay, pokes)
            attempt += 1
            continue
        finished = run.clock()
        faults.reached("after_call", step.name)
        receipt = _entry(
            run, seq, step, _S.COMPLETED, attempt, payload, started, finished, digest=digest
        )
        await _commit_receipt(run, receipt, where, ctx.events)
        faults.reached("after_receipt", step.name)
        return fresh_result(step, payload, where)


def recorded_result(
    run: Run, seq: int, step: steps.StepDefinition, payload: str, where: str
) -> Any:
    """A receipt's result, decoded into the type the step declares today.

    A result that no longer decodes (its class renamed, a field now required)
    stops the workflow as ``diverged`` with RecordedValueMismatch, and every
    later durable call of the run raises it again: deploying compatible code and
    resuming the workflow goes on from here.
    """
    try:
        return declared.decode_result(
            payload, declared.declared_result(step.fn), where=f"{where} result"
        )
    except errors.IncompatibleValue as exc:
        call = journal.describe_call(_STEP, step.name)
        mismatch = errors.RecordedValueMismatch(
            run.workflow_id, seq, call, exc.stored, exc.expected, exc.reason
        )
        raise run.diverge(mismatch) from exc


def fresh_result(step: steps.StepDefinition, payload: str, where: str) -> Any:
    """The result this run just committed, decoded as a replay will decode it."""
    return declared.decode_result(
        payload, declared.declared_result(step.fn), where=f"{where} result"
    )


async def _commit_receipt(
    run: Run, receipt: journal.Entry, where: str, events: Sequence[tuple[str, str]] = ()
) -> None:
    """Commit a step's result, with the events its body set; one the database refuses
    fails the step, once.

    The refusal (``StorageDataError``) is permanent for that value: running the
    step again would only produce it again. So the step is recorded as failed
    with the refusal, which is raised into the workflow like any step error.
    """
    try:
        await run.commit(receipt, events=events)
        if events:  # set_event in the step's body: published with its receipt
            run.events_published(key for key, _ in events)
    except errors.StorageDataError as refused:
        error = errors.StorageDataError(f"{where}: its result cannot be stored: {refused}")
        failed = dataclasses.replace(receipt, status=_S.FAILED, payload=error_json(error))
        await _commit_failure(run, failed, error, where)
        raise error from refused


async def _commit_failure(run: Run, attempt: journal.Entry, exc: BaseException, where: str) -> None:
    """Commit a failed attempt; when the database refuses the error's text, commit it
    again with every non-ASCII character escaped (it decodes to the same text), and
    failing that, a failure that says so without any of the refused text (the
    refusal may quote it). The step's retry policy holds."""
    try:
        await run.commit(attempt)
        return
    except errors.StorageDataError:
        pass
    try:
        await run.commit(dataclasses.replace(attempt, payload=error_json(exc, ascii_only=True)))
        return
    except errors.StorageDataError:
        pass
    error = errors.StorageDataError(
        f"{where}: attempt {attempt.attempt} raised {type(exc).__name__}, and the database "
        "refused to store its text"
    )
    try:
        await run.commit(dataclasses.replace(attempt, payload=error_json(error, ascii_only=True)))
    except errors.StorageDataError as refused:  # not the payload: the entry itself (its name)
        raise errors.StorageDataError(
            f"{where}: the database refuses to record attempt {attempt.attempt} at all: {refused}"
        ) from refused


def _entry(
    run: Run,
    seq: int,
    step: steps.StepDefinition,
    status: str,
    attempt: int,
    payload: str | None,
    started: float | None = None,
    finished: float | None = None,
    wake_at: float | None = None,
    digest: str | None = None,
) -> journal.Entry:
    if started is None:
        started = run.clock()
    return journal.Entry(
        seq, _STEP, step.name, status, attempt, payload, started, finished, wake_at, digest
    )


def _intent(args: tuple[Any, ...], kwargs: dict[str, Any], key: str, where: str) -> str:
    return codec.encode(
        {"args": list(args), "kwargs": kwargs, "idempotency_key": key}, where=f"{where} arguments"
    )


async def _unknown_outcome(
    run: Run,
    seq: int,
    step: steps.StepDefinition,
    intent: journal.Entry,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str,
    where: str,
) -> tuple[Any] | None:
    """Decide about an interrupted intent: (result,) if found, None to run again.

    Parks the workflow in ``needs_review`` when nothing can decide.
    """
    if step.reconcile is not None:
        verdict: Any = None
        raised: Exception | None = None
        ctx = context.StepContext(run.workflow_id, seq, step.name, intent.attempt, key)
        try:
            verdict = await _call(run, step.reconcile, (key, *args), kwargs, ctx)
        except Exception as exc:
            raised = exc
        action, reason = replay.judge_reconcile(verdict, raised)
        if action is _A.RETURN:
            assert isinstance(verdict, steps.Found)
            now = run.clock()
            try:
                payload = codec.encode(verdict.result, where=f"{where} reconciled result")
            except Exception as exc:  # EncodeError, or what a model's serializer raised
                await _unstorable_reconciled(run, intent, exc, where, now)
                raise AssertionError("unreachable: it raises") from exc  # pragma: no cover
            receipt = dataclasses.replace(
                intent, status=_S.COMPLETED, payload=payload, finished_at=now
            )
            await _commit_receipt(run, receipt, where)
            return (fresh_result(step, payload, where),)
        if action is _A.RUN:
            return None
    else:
        reason = replay.AT_MOST_ONCE_REASON
    await _await_review(run, seq, step, intent, key, reason)
    raise AssertionError("unreachable: a review wait ends by parking")  # pragma: no cover


async def _unstorable_reconciled(
    run: Run, intent: journal.Entry, exc: Exception, where: str, now: float
) -> None:
    """Record the interrupted attempt as failed, then raise: reconcile found that the
    call happened, but its result cannot be stored.

    As a result the step returned that cannot be stored fails its attempt, but for
    good, whatever the step's retry policy: the call happened, so running it again
    would repeat it. The failure replaces the intent, so a replay raises it again
    instead of asking reconcile again.
    """
    why = str(exc)  # an EncodeError names the step, workflow and seq already
    if not isinstance(exc, errors.EncodeError):
        why = f"cannot encode {where} reconciled result: {type(exc).__name__}: {exc}"
    error = errors.EncodeError(
        f"{why}; reconcile found that the call happened, so it is not run again"
    )
    failed = dataclasses.replace(
        intent, status=_S.FAILED, payload=error_json(error), finished_at=now, wake_at=None
    )
    await _commit_failure(run, failed, error, where)
    raise error from exc


async def _await_review(
    run: Run, seq: int, step: steps.StepDefinition, intent: journal.Entry, key: str, reason: str
) -> None:
    run.reviewing = True  # if the workflow ends first, its end closes the review
    await run.write("open_review", intent, key, reason)
    with run.not_active():
        while True:
            run.cancel_point(seq, _STEP, step.name)  # asked already: delivered here
            await run.block(REVIEW, key, None)


async def invoke(
    run: Run,
    step: steps.StepDefinition,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    ctx: context.StepContext,
) -> Any:
    """Call the step's function once under its timeout, in the step's context."""
    faults.step_called(step, ctx)  # the test kit counts calls here (durably test-crashes)
    try:
        if step.timeout is None:
            return await _call(run, step.fn, args, kwargs, ctx, step.is_async)
        async with asyncio.timeout(step.timeout) as scope:
            return await _call(run, step.fn, args, kwargs, ctx, step.is_async)
    except TimeoutError:
        if step.timeout is not None and scope.expired():
            raise errors.StepTimeout(
                f"step {step.name!r} attempt {ctx.attempt} ran longer than its "
                f"timeout of {step.timeout}s"
            ) from None
        raise


async def _call(
    run: Run,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    ctx: context.StepContext,
    is_async: bool | None = None,
) -> Any:
    """Call a sync or async function with the step context set; sync ones in a thread.

    ``is_async``: whether ``fn`` is a coroutine function, when the caller knows already.

    A sync function always runs on a step thread, so however long it blocks, the
    event loop goes on. When nothing else is ready to run on the loop (the test
    of an inline commit, and off with it), the loop's thread waits for it up to
    ``thread.HOLD_LOOP`` itself instead of going back to the loop and being woken
    through it: a quick step then costs one thread wake-up each way and no loop
    iteration, and its receipt is committed inline next. Its thread is woken on this
    thread's CPU (``step_threads``: two wake-ups on one CPU cost about half what they
    cost across two). A longer one is awaited as any other future; the loop was
    held at most ``thread.HOLD_LOOP``.
    """
    token = context.current_step.set(ctx)
    try:
        on_loop = inspect.iscoroutinefunction(fn) if is_async is None else is_async
        held: step_threads.Handed | None = None  # the step's thread, while this one holds
        awaitable: Awaitable[Any] | None = None
        if on_loop:
            awaitable = fn(*args, **kwargs)
        else:
            call = contextvars.copy_context().run, functools.partial(fn, *args, **kwargs)
            if run.loop_is_quiet():  # then wait here: its thread is woken on this CPU
                held = run.step_threads.hand(*call)
                if not held.wait(thread.HOLD_LOOP):  # longer: awaited as any other future
                    awaitable, held = run.step_threads.let_go(held), None
            else:
                awaitable = run.step_threads.run(*call)
        with watchdog.async_step(ctx, on_loop):  # named if it blocks the event loop
            if held is not None:
                result = held.result()
            else:
                assert awaitable is not None  # one of the two was made above
                result = await awaitable
            if type(result) not in _PLAIN and inspect.isawaitable(result):
                # a sync callable that returned a coroutine
                result = await result
        return result
    finally:
        context.current_step.reset(token)


#: Result types that are never awaitable: the usual ones skip ``inspect.isawaitable``.
_PLAIN = frozenset({dict, list, str, int, float, bool, type(None), tuple})


async def _backoff(run: Run, seq: int, name: str, wake_at: float, since: int) -> None:
    """Wait until the next attempt is due: a durable timer (the time is in the journal).

    A long back-off parks the workflow like ``durably.sleep``; a short one stays.
    ``since``: the run's pokes when the caller last looked (``Parking.block``).
    """
    with run.not_active():
        while run.clock() < wake_at:
            await run.block(journal.Kind.SLEEP, "", wake_at, since)
            since = run.pokes
            run.cancel_point(seq, _STEP, name)


def error_json(exc: BaseException, *, ascii_only: bool = False) -> str:
    """An exception as stored in a journal entry.

    ``ascii_only`` escapes every other character (``\\u6771``): the same text once
    decoded, for a database that refused it as it was (a LATIN1 PostgreSQL).
    """
    data = codec.encode_error(exc)
    if ascii_only:
        return json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return codec.encode(data, where="step error")


def recorded_error(entry: journal.Entry, where: str) -> BaseException:
    """The exception a failed entry recorded, rebuilt."""
    data = codec.decode(entry.payload or "{}", where=f"{where} recorded error")
    if not isinstance(data, dict):
        return errors.DecodeError(f"{where}: recorded error is not an object")
    return codec.decode_error(data)


#: The default of ``resolve(result=...)``: no result was given (None is a result).
NO_RESULT: Any = object()


def review_decision(
    result: Any = NO_RESULT, retry: bool = False, fail: str | None = None, by: str = "unknown"
) -> tuple[str, str | None]:
    """The (decision, outcome JSON) a person's resolve() call stands for; exactly one choice."""
    chosen = [result is not NO_RESULT, retry, fail is not None]
    if sum(chosen) != 1:
        raise ValueError("resolve() takes exactly one of result=..., retry=True or fail='reason'")
    if retry:
        return "retry", None
    if fail is not None:
        return "fail", error_json(errors.ResolvedAsFailed(f"resolved as failed by {by}: {fail}"))
    return "result", codec.encode(result, where="resolved result")
