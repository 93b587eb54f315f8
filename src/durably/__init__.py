"""durably: durable execution for AI agents.

Every step's result is committed before the workflow moves on; after a crash
the workflow re-runs from its first line and finished steps return their
recorded results. See README.md and docs/.
"""

from durably.agents import (
    Agent,
    AgentResult,
    llm,
    tool,
)
from durably.client import Client
from durably.context import idempotency_key, step_info, workflow_id
from durably.engine import Engine, WorkflowHandle, run
from durably.errors import (
    AlreadyResolved,
    ApprovalRejected,
    Cancelled,
    DatabaseLocked,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DecodeError,
    DefinitionError,
    DurablyError,
    EncodeError,
    FencedError,
    InvalidName,
    MaxTurnsExceeded,
    NonDeterminismError,
    NotADurablyDatabase,
    NothingToResolve,
    NotInWorkflow,
    ResolvedAsFailed,
    SchemaTooNew,
    StepError,
    StepTimeout,
    StoreError,
    ToolError,
    WorkflowFailed,
    WorkflowFinished,
    WorkflowIdConflict,
    WorkflowNotFinished,
    WorkflowNotFound,
    WorkflowNotRegistered,
)
from durably.journal import Claim, Entry, ExecutorInfo, Review, Status, WorkflowInfo
from durably.queues import Queue
from durably.steps import Found, NotFound, Retry, Unknown, run_step, step
from durably.waits import ChildHandle, set_event, sleep, sleep_until, start_child, wait_for_signal
from durably.workflows import compensate, now, random, uuid4, workflow


def _installed_version() -> str:
    """The version pip installed (the wheel's metadata); the source's own when not installed."""
    from importlib import metadata

    try:
        return metadata.version("durably")
    except metadata.PackageNotFoundError:  # run from a source tree without installing it
        return "0.1.0"


__version__ = _installed_version()

__all__ = [
    "Agent",
    "AgentResult",
    "AlreadyResolved",
    "ApprovalRejected",
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
    "InvalidName",
    "MaxTurnsExceeded",
    "NonDeterminismError",
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
    "idempotency_key",
    "llm",
    "now",
    "random",
    "run",
    "run_step",
    "set_event",
    "sleep",
    "sleep_until",
    "start_child",
    "step",
    "step_info",
    "tool",
    "uuid4",
    "wait_for_signal",
    "workflow",
    "workflow_id",
]
