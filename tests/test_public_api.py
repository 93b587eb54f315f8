"""The public surface is deliberate: changing it must change this test."""

from __future__ import annotations

import types

import durably

EXPECTED = sorted(durably.__all__)


def test_all_is_sorted_and_complete() -> None:
    assert durably.__all__ == sorted(durably.__all__)
    # dir(), not vars(): the agent names are loaded on first access (issue 12);
    # getattr resolves them, so a lazy name that cannot be imported fails here.
    public = sorted(
        n
        for n in dir(durably)
        if not n.startswith("_") and not isinstance(getattr(durably, n), types.ModuleType)
    )
    assert public == EXPECTED


def test_all_is_frozen() -> None:
    assert durably.__all__ == FROZEN


FROZEN = [
    "Agent",
    "AgentResult",
    "AlreadyResolved",
    "ApprovalRejected",
    "ArgumentsChanged",
    "Cancelled",
    "ChildHandle",
    "Claim",
    "Client",
    "DatabaseLocked",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "DecodeError",
    "DefinitionError",
    "DurablyError",
    "EncodeError",
    "Engine",
    "Entry",
    "ExecutorInfo",
    "FencedError",
    "Found",
    "HistoryMark",
    "InvalidName",
    "MaxTurnsExceeded",
    "NonDeterminismError",
    "NondeterministicWait",
    "NotADurablyDatabase",
    "NotFound",
    "NotInWorkflow",
    "NothingToResolve",
    "Queue",
    "ResolvedAsFailed",
    "Retry",
    "Review",
    "SchemaTooNew",
    "Status",
    "StepError",
    "StepTimeout",
    "StoreError",
    "ToolError",
    "Unknown",
    "WorkflowFailed",
    "WorkflowFinished",
    "WorkflowHandle",
    "WorkflowIdConflict",
    "WorkflowInfo",
    "WorkflowNotFinished",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "compensate",
    "deprecate_patch",
    "get_event",
    "idempotency_key",
    "llm",
    "now",
    "patched",
    "random",
    "run",
    "run_step",
    "send_signal",
    "set_event",
    "sleep",
    "sleep_until",
    "start_child",
    "step",
    "step_info",
    "tool",
    "uuid4",
    "wait",
    "wait_first",
    "wait_for_signal",
    "workflow",
    "workflow_id",
]


def test_every_error_is_a_durably_error() -> None:
    from durably import errors

    for name in dir(errors):
        obj = getattr(errors, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, Exception)
            and obj.__module__ == errors.__name__
        ):
            assert issubclass(obj, durably.DurablyError), name
