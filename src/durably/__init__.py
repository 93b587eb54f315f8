"""durably: durable execution for AI agents.

Every step's result is committed before the workflow moves on; after a crash
the workflow re-runs from its first line and finished steps return their
recorded results. See README.md and docs/.
"""

import typing

from durably.client import Client
from durably.context import idempotency_key, step_info, workflow_id
from durably.engine import Engine, WorkflowHandle, run
from durably.errors import (
    AlreadyResolved,
    ApprovalRejected,
    ArgumentsChanged,
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
    NondeterministicWait,
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
from durably.journal import (
    Claim,
    Entry,
    ExecutorInfo,
    HistoryMark,
    Review,
    Status,
    WorkflowInfo,
)
from durably.messages import get_event, send_signal
from durably.queues import Queue
from durably.races import wait, wait_first
from durably.steps import Found, NotFound, Retry, Unknown, run_step, step
from durably.waits import ChildHandle, set_event, sleep, sleep_until, start_child, wait_for_signal
from durably.workflows import (
    compensate,
    deprecate_patch,
    now,
    patched,
    random,
    uuid4,
    workflow,
)

if typing.TYPE_CHECKING:
    from durably.agents import Agent, AgentResult, llm, tool

    __version__: str

# The agents package is loaded on first use: a workflow that never builds an
# agent should not pay for it at import (issue 12). Name -> the module holding it.
_LAZY = {
    "Agent": "durably.agents.agent",
    "AgentResult": "durably.agents.agent",
    "llm": "durably.agents.durable_client",
    "tool": "durably.agents.tools",
}


def __getattr__(name: str) -> typing.Any:
    """Import a lazily loaded public name on first access, then keep it in the module."""
    if name == "__version__":  # read from the installed metadata on first use
        version = globals()["__version__"] = _installed_version()
        return version
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'durably' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones included (before their first use too)."""
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


def _installed_version() -> str:
    """The version pip installed (the wheel's metadata); the source's own when not installed.

    Read on first use of ``durably.__version__``, not at import: ``importlib.metadata``
    costs ``import durably`` 8-9 ms (issue 12).
    """
    from importlib import metadata

    try:
        return metadata.version("durably")
    except metadata.PackageNotFoundError:  # run from a source tree without installing it
        return "0.1.0"


__all__ = [
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
