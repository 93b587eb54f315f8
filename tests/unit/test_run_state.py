"""The life of a run as one State, checked on a Run with no engine and no database.

The transitions that need no store (close, lose, retire, cancellation) are driven
here directly; parking, which writes, is covered by tests/test_promise_guards.py and
tests/test_waiting.py on both backends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from durably import errors, journal, workflow_run

State = workflow_run.State


def make_run(
    cancel_requested: int = 0, history: list[journal.Entry] | None = None
) -> workflow_run.Run:
    services = workflow_run.Services(
        store=None,  # type: ignore[arg-type]  # these transitions never write
        clock=lambda: 0.0,
        step_threads=concurrent.futures.ThreadPoolExecutor(1),
        stopping=asyncio.Event(),
    )
    info = journal.WorkflowInfo(
        "wf", "flow", "running", "{}", epoch=3, cancel_requested=cancel_requested
    )
    return workflow_run.Run(services, info, history or [])


def test_the_state_docstring_names_every_state() -> None:
    doc = workflow_run.State.__doc__ or ""
    for state in State:
        assert state.name in doc


async def test_a_new_run_is_running_and_holds_its_workflow() -> None:
    run = make_run()
    assert (run.state, run.let_go, run.listening, run.closing) == (
        State.RUNNING,
        False,
        True,
        False,
    )
    assert run.take_seq() == 1


async def test_closing_refuses_new_calls_and_retiring_ends_the_run() -> None:
    run = make_run()
    await run.close()
    assert (run.state, run.closing, run.let_go) == (State.CLOSING, True, False)
    with pytest.raises(workflow_run.Suspended, match="function has ended"):
        run.take_seq()
    run.retire()
    assert (run.state, run.let_go, run.listening) == (State.RETIRED, True, False)
    with pytest.raises(workflow_run.Suspended, match="let go"):
        run.take_seq()


async def test_a_lost_run_raises_its_fence_and_still_hears_wake_ups() -> None:
    run = make_run()
    fenced = errors.FencedError("now at epoch 4")
    run.lose(fenced)
    assert (run.state, run.let_go, run.listening) == (State.LOST, True, True)
    with pytest.raises(errors.FencedError) as caught:
        run.take_seq()
    assert caught.value is fenced
    run.retire()  # the task ended: retired, and the fence is still what later calls get
    assert run.state is State.RETIRED
    with pytest.raises(errors.FencedError):
        run.take_seq()


@pytest.mark.parametrize(
    ("requested", "delivered", "in_journal", "due"),
    [
        (False, False, False, False),
        (True, False, False, True),
        (True, True, False, False),  # delivered once, never again
        (True, False, True, False),  # a replay meets it at its journaled seq, not earlier
        (False, False, True, False),
    ],
)
def test_cancellation_is_due_once(
    requested: bool, delivered: bool, in_journal: bool, due: bool
) -> None:
    assert workflow_run.Cancellation(requested, delivered, in_journal).due is due


async def test_a_requested_cancellation_is_delivered_at_the_next_call_and_staged() -> None:
    run = make_run(cancel_requested=1)
    seq = run.take_seq()
    with pytest.raises(errors.Cancelled, match=r"\(seq 1\)"):
        run.lookup(seq, "step", "s")
    assert run.cancellation.delivered
    assert [(e.kind, e.name) for e in run._pending] == [("cancel", "step 's'")]  # its call
    run.cancel_point(run.take_seq(), "sleep", "")  # once only: no second Cancelled


async def test_a_journaled_cancellation_is_raised_at_its_own_seq() -> None:
    marker = journal.Entry(2, journal.Kind.CANCEL, "", "completed", 1, None, 0.0, 0.0)
    done = journal.Entry(1, journal.Kind.STEP, "s", "completed", 1, "1", 0.0, 0.0)
    run = make_run(cancel_requested=1, history=[done, marker])
    first: Any = run.lookup(run.take_seq(), "step", "s")
    assert first == done  # not earlier
    with pytest.raises(errors.Cancelled, match=r"\(seq 2\)"):
        run.lookup(run.take_seq(), "sleep", "")
