"""Test kit for agents built on durably: real services that count side effects, and
``crash_points`` to kill your own workflow at every commit boundary, and ``replay`` to
check today's code against recorded journals."""

from durably.testing.crashes import (
    Boundary,
    CrashReport,
    CrashToolError,
    KeyCount,
    Scenario,
    crash_points,
)
from durably.testing.models import FakeModelServer, by_turn, call, failure, text, tool_calls
from durably.testing.payments import FakePaymentsServer, refund
from durably.testing.replaying import replay

__all__ = [
    "Boundary",
    "CrashReport",
    "CrashToolError",
    "FakeModelServer",
    "FakePaymentsServer",
    "KeyCount",
    "Scenario",
    "by_turn",
    "call",
    "crash_points",
    "failure",
    "refund",
    "replay",
    "text",
    "tool_calls",
]
