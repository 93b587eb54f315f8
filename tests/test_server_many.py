"""Many dashboard processes on one database: two real ``durably serve`` share sessions and state.

The servers keep no state of their own: a session made by one is accepted by
the other (same tokens), and a decision taken through one shows on the other,
pushed by its event stream.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx

import durably
from tests.serverkit import harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


def _api(base: str, path: str) -> Any:
    r = httpx.get(base + path, headers=BEARER, timeout=10)
    r.raise_for_status()
    return r.json()


def _versions_until(base: str, cookie: str, seen: list[str]) -> None:
    """Collect the versions /api/events on ``base`` pushes (with the session cookie),
    until it has pushed a second, different one."""
    with httpx.stream(
        "GET",
        base + "/api/events",
        params={"workflow_id": "refund-A1", "seconds": "60"},
        cookies={"durably_session": cookie},
        timeout=30,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen.append(json.loads(line.partition(":")[2])["version"])
            if len(set(seen)) > 1:
                return


def test_two_servers_share_sessions_and_see_each_others_decisions(store_url: str) -> None:
    client = durably.Client(store_url)
    client.start("srv-refund", "A1", 12_000, workflow_id="refund-A1")
    with (
        harness.worker(store_url, lease=1.0),
        harness.server(store_url) as one,
        harness.server(store_url) as two,
    ):
        assert one != two
        harness.until(lambda: _api(two, "/api/approvals")["approvals"], "the refund approval")

        # log in on one; the session is accepted by two
        with httpx.Client(timeout=10) as first:
            login = harness.login(first, one, next="/")
        assert login.status_code == 303
        cookie = login.cookies["durably_session"]
        browser = httpx.Client(cookies={"durably_session": cookie}, timeout=10)
        got = browser.get(two + "/api/workflows/refund-A1")
        assert got.status_code == 200 and got.json()["workflow_id"] == "refund-A1"
        page = browser.get(two + "/workflows/refund-A1")
        assert page.status_code == 200 and "/login" not in str(page.url)
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        expect = re.search(r'name="expect" value="([^"]+)"', page.text)
        assert csrf is not None and expect is not None

        # two's event stream is open while the decision goes through one
        seen: list[str] = []
        listener = threading.Thread(target=_versions_until, args=(two, cookie, seen), daemon=True)
        listener.start()
        harness.until(lambda: seen, "two's first event")
        first = seen[0]
        # the CSRF token two's page carried is good on one: both derive it from the session
        r = browser.post(
            one + "/workflows/refund-A1/approve",
            data={"csrf_token": csrf.group(1), "expect": expect.group(1), "note": "ok"},
        )
        assert r.status_code == 303, r.text
        harness.until(
            lambda: _api(two, "/api/workflows/refund-A1")["status"] == "completed",
            "two to see the refund complete",
        )
        listener.join(30)
        assert not listener.is_alive(), "two's stream never pushed the change"
        assert seen[-1] != first
        assert _api(two, "/api/approvals")["approvals"] == []
        [decision] = _api(two, "/api/workflows/refund-A1/history")["signals"]
        assert decision["payload"]["by"] == "alice"  # the token's name, whichever server
        assert _api(two, "/api/workflows/refund-A1")["output"]["refund_id"] == "re_A1"
        browser.close()
