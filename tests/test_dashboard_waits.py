"""What a parked workflow waits for (server/waiting.py), and the dashboard's Send signal
form: its CSRF check, its JSON check, and a signal delivered to a workflow a real
engine runs. The browser test of the words on the page is in
tests/test_dashboard_pages_browser.py."""

from __future__ import annotations

from durably import journal
from durably.server import waiting

T = 1_700_000_000.0


def _open(kind: str, name: str, status: str = "started", **more: float) -> journal.Entry:
    return journal.Entry(3, kind, name, status, 2, None, T, None, more.get("wake_at"))


def test_each_open_wait_is_described_and_a_running_step_is_not() -> None:
    assert waiting.describe(_open("join", "order-1-child")) == {
        "kind": "child", "name": "order-1-child", "of": None, "since": T, "until": None,
    }  # fmt: skip
    event = waiting.describe(_open("get_event", "shipped of order-1", wake_at=T + 60))
    assert event == {
        "kind": "event", "name": "shipped", "of": "order-1", "since": T, "until": T + 60,
    }  # fmt: skip
    retry = waiting.describe(_open("step", "charge", "retrying", wake_at=T + 5))
    assert retry is not None and retry["kind"] == "retry" and retry["attempt"] == 2
    assert waiting.describe(_open("step", "charge")) is None  # running: waits for nothing
    assert waiting.describe(_open("signal", "go", "completed")) is None
