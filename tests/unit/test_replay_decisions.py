"""The replay decisions as pure functions: tables of journal entries and what they mean.

No process, no database, no clock: every input is an argument. Each table covers
every entry status, so a status added to journal.EntryStatus fails here until its
meaning is decided.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from durably import codec, errors, journal, replay, steps

S = journal.EntryStatus
A = replay.Action


def step_entry(status: str, attempt: int = 1, wake_at: float | None = None) -> journal.Entry:
    return journal.Entry(4, "step", "charge", status, attempt, '{"x":1}', 10.0, 11.0, wake_at)


# --- plan_step: what a step's entry means for the call ----------------------------------

# (status, wake_at, reconciles) -> (action, attempt, wake_at); attempt 2 is in the journal
STEP_TABLE = [
    (None, None, False, A.RUN, 1, None),
    (None, None, True, A.RUN, 1, None),
    (S.COMPLETED, None, False, A.RETURN, 1, None),
    (S.COMPLETED, None, True, A.RETURN, 1, None),
    (S.FAILED, None, False, A.RAISE, 1, None),
    (S.FAILED, None, True, A.RAISE, 1, None),
    (S.RETRYING, 99.0, False, A.BACKOFF, 3, 99.0),
    (S.RETRYING, 99.0, True, A.BACKOFF, 3, 99.0),
    (
        S.RETRYING,
        None,
        False,
        A.RUN,
        3,
        None,
    ),  # no back-off recorded: the next attempt runs at once
    (S.STARTED, None, True, A.RECONCILE, 3, None),
    (S.STARTED, None, False, A.REVIEW, 3, None),  # at_most_once: a person decides
    (S.TIMED_OUT, None, False, A.RUN, 1, None),  # never written for a step: run as new
    (S.TIMED_OUT, None, True, A.RUN, 1, None),
]


@pytest.mark.parametrize(
    ("status", "wake_at", "reconciles", "action", "attempt", "due"),
    STEP_TABLE,
    ids=[f"{row[0]}-wake={row[1]}-reconciles={row[2]}" for row in STEP_TABLE],
)
def test_plan_step(
    status: str | None,
    wake_at: float | None,
    reconciles: bool,
    action: replay.Action,
    attempt: int,
    due: float | None,
) -> None:
    entry = None if status is None else step_entry(status, attempt=2, wake_at=wake_at)
    assert replay.plan_step(entry, reconciles=reconciles) == replay.StepPlan(action, attempt, due)


def test_the_step_table_covers_every_entry_status() -> None:
    assert {row[0] for row in STEP_TABLE} == {None, *S}


# --- judge_reconcile: what a reconcile function's answer means ----------------------------

RECONCILE_TABLE = [
    (steps.Found({"id": 7}), None, A.RETURN, "reconcile answered Found(result={'id': 7})"),
    (steps.NotFound, None, A.RUN, "reconcile answered durably.NotFound"),
    (steps.Unknown, None, A.REVIEW, "reconcile answered durably.Unknown"),
    (None, ValueError("down"), A.REVIEW, "reconcile raised ValueError: down"),
    ("yes", None, A.REVIEW, "reconcile returned 'yes', not Found(...), NotFound or Unknown"),
    (None, None, A.REVIEW, "reconcile returned None, not Found(...), NotFound or Unknown"),
]


@pytest.mark.parametrize(("verdict", "raised", "action", "reason"), RECONCILE_TABLE)
def test_judge_reconcile(
    verdict: object, raised: BaseException | None, action: replay.Action, reason: str
) -> None:
    assert replay.judge_reconcile(verdict, raised) == (action, reason)


# --- signal_outcome: how a signal wait ends (the timeout rule) ------------------------------

WAIT = journal.Entry(5, "signal", "approval", S.STARTED, 1, None, 100.0, None, 200.0)
FOREVER = dataclasses.replace(WAIT, wake_at=None)

# (wait, signal payload found, now) -> (status, payload, finished_at)
SIGNAL_TABLE = [
    (WAIT, '"yes"', 150.0, S.COMPLETED, '"yes"', 150.0),
    (WAIT, '"late"', 250.0, S.COMPLETED, '"late"', 250.0),  # a signal beats the deadline
    (WAIT, None, 150.0, S.STARTED, None, None),  # keeps waiting
    (WAIT, None, 200.0, S.TIMED_OUT, None, 200.0),  # the deadline itself has passed
    (WAIT, None, 250.0, S.TIMED_OUT, None, 250.0),
    (FOREVER, None, 1e12, S.STARTED, None, None),  # no timeout: never times out
    (FOREVER, "null", 150.0, S.COMPLETED, "null", 150.0),
]


@pytest.mark.parametrize(("wait", "signal", "now", "status", "payload", "finished"), SIGNAL_TABLE)
def test_signal_outcome(
    wait: journal.Entry,
    signal: str | None,
    now: float,
    status: str,
    payload: str | None,
    finished: float | None,
) -> None:
    out = replay.signal_outcome(wait, signal, now)
    assert (out.status, out.payload, out.finished_at) == (status, payload, finished)
    assert (out.seq, out.kind, out.name, out.wake_at) == (
        wait.seq,
        wait.kind,
        wait.name,
        wait.wake_at,
    )


def child(status: str) -> journal.WorkflowInfo:
    return journal.WorkflowInfo("kid", "child_wf", status, "{}", output='"ok"', error=None)


JOIN = journal.Entry(6, "join", "kid", S.STARTED, 1, None, 100.0)


@pytest.mark.parametrize("status", list(journal.Status))
def test_join_outcome_for_every_workflow_status(status: journal.Status) -> None:
    out = replay.join_outcome(JOIN, child(status), 300.0)
    if status.finished:
        assert out.status == S.COMPLETED and out.finished_at == 300.0
        assert json.loads(out.payload or "") == {"status": status, "output": '"ok"', "error": None}
    else:
        assert out == JOIN  # still waiting


def test_join_outcome_for_a_child_not_there_yet() -> None:
    assert replay.join_outcome(JOIN, None, 300.0) == JOIN


# --- plan_reopen: the journal edit of ``resume`` --------------------------------------------


def e(seq: int, kind: str, status: str, name: str = "s") -> journal.Entry:
    return journal.Entry(seq, kind, name if kind == "step" else "", status, 1, None, 1.0)


REOPEN_TABLE = [
    ("failed, its last failed step retries", "failed",
     [e(1, "step", S.COMPLETED), e(2, "step", S.FAILED), e(3, "step", S.FAILED)],
     replay.Reopening(retry_seq=3)),
    ("failed with no failed step (an error outside steps)", "failed",
     [e(1, "step", S.COMPLETED)], replay.Reopening()),
    ("cancelled: continues from the marker", "cancelled",
     [e(1, "step", S.COMPLETED), e(2, "cancel", S.COMPLETED), e(3, "step", S.FAILED)],
     replay.Reopening(delete_from=2)),
    ("failed after a cancellation: the marker wins", "failed",
     [e(1, "cancel", S.COMPLETED), e(2, "step", S.FAILED)], replay.Reopening(delete_from=1)),
    ("diverged: nothing to edit", "diverged", [e(1, "step", S.COMPLETED)], replay.Reopening()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "history", "edit"), [r[1:] for r in REOPEN_TABLE], ids=[r[0] for r in REOPEN_TABLE]
)
def test_plan_reopen(status: str, history: list[journal.Entry], edit: replay.Reopening) -> None:
    assert replay.plan_reopen("wf", status, history) == edit


@pytest.mark.parametrize(
    "status", [s for s in journal.Status if s not in ("failed", "cancelled", "diverged")]
)
def test_plan_reopen_refuses_a_workflow_that_did_not_end_badly(status: str) -> None:
    with pytest.raises(errors.DurablyError, match=f"'wf' is {status}; only a failed"):
        replay.plan_reopen("wf", status, [])


def test_plan_reopen_refuses_to_forget_steps_run_after_a_cancellation() -> None:
    history = [e(1, "cancel", S.COMPLETED), e(2, "step", S.COMPLETED, name="undo")]
    with pytest.raises(errors.DurablyError, match=r"ran 1 step\(s\) after.*'undo' at seq 2"):
        replay.plan_reopen("wf", "cancelled", history)


# --- resolved_entry: the journal edit of ``resolve`` ------------------------------------------

REVIEW = journal.Review("wf", 4, 2, "charge", "wf:4", '{"args":[1]}', "why", 50.0)

RESOLVE_TABLE = [
    ("result", '"paid"', S.COMPLETED, '"paid"', None),
    ("fail", '{"type":"ResolvedAsFailed"}', S.FAILED, '{"type":"ResolvedAsFailed"}', None),
    ("retry", None, S.RETRYING, '{"args":[1]}', 70.0),  # due now, with the intent's arguments
]


@pytest.mark.parametrize(("decision", "outcome", "status", "payload", "wake_at"), RESOLVE_TABLE)
def test_resolved_entry(
    decision: str, outcome: str | None, status: str, payload: str | None, wake_at: float | None
) -> None:
    entry = replay.resolved_entry(REVIEW, decision, outcome, 70.0)
    assert entry == journal.Entry(4, "step", "charge", status, 2, payload, 50.0, 70.0, wake_at)
    # and the step's next call reads it as the person meant (a retry is a back-off due now)
    plan = replay.plan_step(entry, reconciles=False)
    assert plan.action == {"result": A.RETURN, "fail": A.RAISE, "retry": A.BACKOFF}[decision]


# --- a recorded value the code cannot take ------------------------------------------------


def test_a_divergence_on_a_value_is_kept_and_raised_by_every_later_call() -> None:
    entries = [step_entry(S.COMPLETED), journal.Entry(5, "now", "", S.COMPLETED, 1, "1.0")]
    replayer = replay.Replayer("wf", entries)
    mismatch = errors.RecordedValueMismatch("wf", 4, "step 'charge'", "dict {x: int}", "int", "no")
    assert replayer.diverge(mismatch) is mismatch
    assert replayer.diverged is mismatch
    other = errors.RecordedValueMismatch("wf", 5, "now", "", "", "")
    assert replayer.diverge(other) is mismatch  # the first one stands
    with pytest.raises(errors.RecordedValueMismatch) as caught:
        replayer.lookup(5, "now", "")
    assert caught.value is mismatch
    with pytest.raises(errors.RecordedValueMismatch):
        replayer.check_finished()
    assert "at seq 4" in str(mismatch) and "stored value: dict {x: int}" in str(mismatch)
    rebuilt = codec.decode_error(codec.encode_error(mismatch))  # as a handle's result raises it
    assert type(rebuilt) is errors.RecordedValueMismatch and str(rebuilt) == str(mismatch)


# --- plan_patch: what durably.patched() finds at the next seq ---------------------------

P = replay.Patch


def entry_of(kind: str, name: str) -> journal.Entry:
    return journal.Entry(5, kind, name, S.COMPLETED, 1, None, 1.0, 1.0)


@pytest.mark.parametrize(
    ("entry", "plan"),
    [
        (None, P.NEW),  # the workflow reaches this point now: the new path
        (entry_of("patch", "fix-1"), P.MARKED),  # it took the new path before
        (entry_of("patch", "fix-2"), P.PASSED),  # another change's marker: not this one's
        (entry_of("step", "old_path"), P.PASSED),  # old code went on past this point
        (entry_of("signal", "go"), P.PASSED),
        (entry_of("cancel", ""), P.PASSED),  # cancelled here by old code
    ],
)
def test_plan_patch(entry: journal.Entry | None, plan: replay.Patch) -> None:
    assert replay.plan_patch(entry, "fix-1") is plan


def test_a_divergence_names_the_site_and_the_code_of_both_sides() -> None:
    replayer = replay.Replayer(
        "wf", [entry_of("step", "charge")], "version 2, source aa", "version 3, source bb"
    )
    replayer.note_site(5, ("app.py", 42))
    with pytest.raises(errors.NonDeterminismError) as caught:
        replayer.lookup(5, "step", "refund")
    assert str(caught.value) == (
        "workflow 'wf' diverged from its journal at seq 5: the journal recorded step 'charge' "
        "(under version 2, source aa), the code asked for step 'refund' at app.py:42 "
        "(under version 3, source bb)"
    )
    # rebuilt from its journaled record (codec.encode_error / decode_error), it says the same
    from durably import codec

    rebuilt = codec.decode_error(codec.encode_error(caught.value))
    assert isinstance(rebuilt, errors.NonDeterminismError)
    assert str(rebuilt) == str(caught.value) and rebuilt.site == "app.py:42"
