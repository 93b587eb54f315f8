"""durably: durable execution for AI agents.

Every step's result is committed before the workflow moves on; after a crash
the workflow re-runs from its first line and finished steps return their
recorded results. See README.md and docs/.
"""

from durably.client import Client
from durably.context import idempotency_key, step_info
from durably.engine import Engine, WorkflowHandle, run
from durably.errors import (
    Cancelled,
    DatabaseLocked,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DecodeError,
    DefinitionError,
    DurablyError,
    EncodeError,
    FencedError,
    NonDeterminismError,
    NotADurablyDatabase,
    NotInWorkflow,
    SchemaTooNew,
    StepError,
    StepTimeout,
    StoreError,
    WorkflowFailed,
    WorkflowIdConflict,
    WorkflowNotFound,
    WorkflowNotRegistered,
)
from durably.journal import Claim, Entry, ExecutorInfo, Status, WorkflowInfo
from durably.step import Retry, run_step, step
from durably.workflow import now, random, uuid4, workflow

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
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
    "NonDeterminismError",
    "NotADurablyDatabase",
    "NotInWorkflow",
    "Retry",
    "SchemaTooNew",
    "Status",
    "StepError",
    "StepTimeout",
    "StoreError",
    "WorkflowFailed",
    "WorkflowHandle",
    "WorkflowIdConflict",
    "WorkflowInfo",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "idempotency_key",
    "now",
    "random",
    "run",
    "run_step",
    "step",
    "step_info",
    "uuid4",
    "workflow",
]
