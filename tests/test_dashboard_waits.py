"""What a parked workflow waits for (server/waiting.py), and the dashboard's Send signal
form: its CSRF check, its JSON check, and a signal delivered to a workflow a real
engine runs. The browser test of the words on the page is in
tests/test_dashboard_pages_browser.py."""

from __future__ import annotations

import json
import re

from starlette.testclient import TestClient

import durably
from durably import journal
from durably.server import app, auth, waiting
from tests.serverkit import harness

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


def _form(page: str) -> dict[str, str]:
    """The Send signal form's fields as the page fills them."""
    found = re.search(r'<form class="send-signal"(.*?)</form>', page, re.S)
    assert found is not None, page
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', found[1]))
    fields.setdefault("payload", "")
    return fields


def test_the_send_signal_form_checks_csrf_and_json_then_delivers(sqlite_url: str) -> None:
    """A waiting workflow's page offers the form, named for the signal it waits for. A
    post without the session's CSRF token is a 403, a payload that is not JSON a 422 that
    says so, and neither sends anything; a good one reaches the workflow, which a real
    engine runs to completion with the payload."""
    client = durably.Client(sqlite_url)
    client.start("srv-wait", workflow_id="w")
    with (
        TestClient(app.create_app(sqlite_url, auth.parse_tokens(harness.SECRET, "t"))) as c,
        harness.engine_thread(sqlite_url),
    ):
        harness.until(lambda: client.get_workflow("w").status == "waiting", "the wait")
        assert harness.login(c, name="alice").status_code == 303
        fields = _form(c.get("/workflows/w").text)
        assert fields["name"] == "go" and fields[auth.CSRF_FIELD]
        action = "/workflows/w/signal"

        forged = {**fields, auth.CSRF_FIELD: "wrong", "payload": '{"ok": true}'}
        r = c.post(action, data=forged, follow_redirects=False)
        assert r.status_code == 403 and "CSRF" in r.text
        r = c.post(action, data={**fields, "payload": "{ok: true"}, follow_redirects=False)
        assert r.status_code == 422 and "not JSON" in r.text, r.text
        r = c.post(action, data={**fields, "name": " ", "payload": "1"}, follow_redirects=False)
        assert r.status_code == 422 and "name" in r.text, r.text
        assert client.signals_page("w", limit=10) == []

        sent = {**fields, "payload": '{"ok": true, "n": 2}'}
        r = c.post(action, data=sent, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/workflows/w", r.text
        harness.until(lambda: client.get_workflow("w").status == "completed", "the end")
        assert json.loads(client.get_workflow("w").output or "") == {"ok": True, "n": 2}
        assert 'class="send-signal"' not in c.get("/workflows/w").text  # finished: no form
        # a finished workflow keeps no signal: a 409 that says why
        r = c.post(action, data=sent, follow_redirects=False)
        assert r.status_code == 409, (r.status_code, r.text)
