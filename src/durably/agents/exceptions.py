"""The errors and warnings of the agent layer.

The errors live in :mod:`durably.errors` (one exception tree); they are
re-exported here for the agent modules. Each can be rebuilt from its
constructor arguments, so a journaled failure re-raises with its own type.
"""

from __future__ import annotations

from durably.errors import (
    ApprovalAlreadyDecided,
    ApprovalError,
    ApprovalNotPending,
    ApprovalRejected,
    ApprovalStale,
    BudgetExceeded,
    MaxTurnsExceeded,
    ModelResponseError,
    OutputValidationError,
    ToolError,
)

__all__ = [
    "ApprovalAlreadyDecided",
    "ApprovalError",
    "ApprovalNotPending",
    "ApprovalRejected",
    "ApprovalStale",
    "BudgetExceeded",
    "ClientRetriesWarning",
    "MaxTurnsExceeded",
    "ModelResponseError",
    "OutputValidationError",
    "ToolError",
    "rejection_text",
]


def rejection_text(by: str, reason: str) -> str:
    """What the model reads when a call was rejected: ``rejected by alice: too large``."""
    return f"rejected by {by}: {reason}" if reason else f"rejected by {by}"


class ClientRetriesWarning(UserWarning):
    """An OpenAI client retries on its own; durably owns retries (use ``max_retries=0``)."""
