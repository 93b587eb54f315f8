"""The pure decisions of a cancel and a deadline (durably.cancellation), table by table."""

from __future__ import annotations

import pytest

from durably import cancellation, errors

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("status", "requested", "deadline", "final"),
    [
        ("completed", 0, None, "completed"),
        ("completed", 1, None, "cancelled"),  # returned after the cancel was committed
        ("completed", 0, NOW, "cancelled"),  # returned at its deadline
        ("completed", 0, NOW + 1, "completed"),  # before its deadline
        ("failed", 1, NOW - 1, "failed"),  # a failure says what went wrong: kept
        ("diverged", 1, None, "diverged"),
        ("cancelled", 1, None, "cancelled"),
    ],
)
def test_the_final_status_of_a_workflow_asked_to_stop(
    status: str, requested: int, deadline: float | None, final: str
) -> None:
    assert cancellation.final_status(status, requested, deadline, NOW) == final


@pytest.mark.parametrize(
    ("timeout", "inherited", "deadline"),
    [
        (None, None, None),
        (5.0, None, NOW + 5),
        (None, NOW + 3, NOW + 3),  # a child without its own: its parent's
        (5.0, NOW + 3, NOW + 3),  # never later than the parent's
        (1.0, NOW + 3, NOW + 1),
    ],
)
def test_a_deadline_is_never_later_than_the_inherited_one(
    timeout: float | None, inherited: float | None, deadline: float | None
) -> None:
    assert cancellation.deadline_of(timeout, NOW, inherited) == deadline


def test_the_message_names_the_deadline_only_once_it_passed() -> None:
    before = cancellation.cancelled("w", "(seq 3)", NOW + 1, NOW)
    after = cancellation.cancelled("w", "(seq 3)", NOW, NOW)
    assert isinstance(after, errors.Cancelled)
    assert str(before) == "workflow 'w' was cancelled (seq 3)"
    assert str(after) == (
        "workflow 'w' was cancelled (seq 3): its deadline 1970-01-12T13:46:40.000+00:00 passed"
    )
    assert not cancellation.passed(None, NOW) and cancellation.passed(NOW, NOW)
