"""Workflow ids with a '/' in them, through a real ``durably serve`` on 127.0.0.1.

An id such as ``orders/17`` is one path segment when its '/' is sent as ``%2F``
(``/api/workflows/orders%2F17``): the API and the dashboard reach that workflow
by it (read, signal, cancel, resume, approve, resolve), and every link and form
the dashboard renders for it leads to a page or an action that works.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest

import durably
from durably.server import auth
from tests.serverkit import harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('slash-ids') / 'durably.db'}"


@pytest.fixture(scope="module")
def base(url: str) -> Iterator[str]:
    with harness.server(url) as served:
        yield served


@pytest.fixture(scope="module")
def browser(base: str) -> Iterator[httpx.Client]:
    """An HTTP client logged in to the dashboard (its session cookie)."""
    with httpx.Client(timeout=10) as http:
        assert harness.login(http, base).status_code == 303
        yield http


def _at(wid: str) -> str:
    """The path segment of ``wid``: every character that is not plain, escaped ('/' too)."""
    return urllib.parse.quote(wid, safe="")


def _targets(html: str) -> list[str]:
    """Every path on this server a page links to or posts to."""
    return [t.replace("&amp;", "&") for t in re.findall(r'(?:href|action)="(/[^"]*)"', html)]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None, html
    return found[1]


@pytest.mark.parametrize("wid", ["orders/17", "a/history", "50%/off", "/lead/"])
def test_the_api_reads_signals_and_cancels_a_workflow_whose_id_has_a_slash(
    base: str, url: str, wid: str
) -> None:
    """GET, history, signals, signal, cancel and resume of ``/api/workflows/<id, '/' as
    %2F>`` all act on that workflow (an id ending like a route, ``a/history``, too)."""
    client = durably.Client(url)
    client.start("srv-wait", workflow_id=wid)
    at = f"{base}/api/workflows/{_at(wid)}"
    r = httpx.get(at, headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["workflow_id"] == wid
    r = httpx.get(at + "/history", headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text
    r = httpx.post(at + "/signals", json={"name": "note", "payload": 1}, headers=BEARER)
    assert r.status_code in (200, 201, 202), r.text
    r = httpx.get(at + "/signals", headers=BEARER, timeout=10)
    assert r.status_code == 200 and [s["name"] for s in r.json()["signals"]] == ["note"], r.text
    r = httpx.post(at + "/cancel", json={}, headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text
    assert client.get_workflow(wid).status == "cancelled"
    r = httpx.post(at + "/resume", json={}, headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text
    assert client.get_workflow(wid).status == "pending"


def test_a_signal_through_the_api_reaches_a_running_workflow_whose_id_has_a_slash(
    base: str, url: str
) -> None:
    """The signal a waiting workflow ``signals/1`` takes, sent as ``signals%2F1``, ends it."""
    client = durably.Client(url)
    client.start("srv-wait", workflow_id="signals/1")
    with harness.engine_thread(url):
        harness.until(lambda: client.get_workflow("signals/1").status == "waiting", "the wait")
        r = httpx.post(
            f"{base}/api/workflows/{_at('signals/1')}/signals",
            json={"name": "go", "payload": {"ok": True}},
            headers=BEARER,
        )
        assert r.status_code in (200, 201, 202), r.text
        harness.until(lambda: client.get_workflow("signals/1").finished, "the workflow to end")
    r = httpx.get(f"{base}/api/workflows/{_at('signals/1')}", headers=BEARER)
    assert r.json()["status"] == "completed" and r.json()["output"] == {"ok": True}


def test_the_dashboard_shows_and_cancels_a_workflow_whose_id_has_a_slash(
    base: str, url: str, browser: httpx.Client
) -> None:
    """The page of ``pages/1``, reached from the list's link, is that workflow's; each of
    its links opens a page, and its cancel form cancels it and goes back to the page."""
    client = durably.Client(url)
    client.start("srv-wait", workflow_id="pages/1")
    listing = browser.get(base + "/", params={"id_prefix": "pages/"}).text
    link = f"/workflows/{_at('pages/1')}"
    assert link in _targets(listing), listing
    page = browser.get(base + link)
    assert page.status_code == 200, page.text
    assert '<h1 class="mono">pages/1</h1>' in page.text, page.text
    for target in _targets(page.text):
        if "/cancel" in target or "/resume" in target or target == "/logout":
            continue
        r = browser.get(base + target)
        assert r.status_code == 200 and "Not found" not in r.text, (target, r.text[:300])
    [cancel] = [t for t in _targets(page.text) if t.endswith("/cancel")]
    r = browser.post(base + cancel, data={"csrf_token": _csrf(page.text)}, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert client.get_workflow("pages/1").status == "cancelled"
    back = browser.get(base + r.headers["location"])
    assert back.status_code == 200 and '<h1 class="mono">pages/1</h1>' in back.text
    # not logged in: the login page brings the person back to this workflow's page
    with httpx.Client(timeout=10) as fresh:
        r = fresh.get(base + link, follow_redirects=False)
        assert r.status_code == 303
        login_page = fresh.get(base + r.headers["location"]).text
        assert f'name="next" value="{link}"' in login_page, login_page
        r = harness.login(fresh, base, next=link)
        assert r.headers["location"] == link


def test_the_dashboard_approves_and_resolves_for_workflows_whose_ids_have_a_slash(
    base: str, url: str, browser: httpx.Client
) -> None:
    """The approval form of ``refunds/A1`` and the review form of ``transfers/T1``, posted
    as the pages render them, decide for those workflows and come back to a page."""
    client = durably.Client(url)
    harness.park_for_review(url, "transfers/T1", "T1")
    client.start("srv-refund", "A1", 500, workflow_id="refunds/A1")
    with harness.engine_thread(url):
        harness.until(lambda: client.list_approvals("refunds/A1"), "the refund approval")
        harness.until(
            lambda: client.get_workflow("transfers/T1").status == "needs_review", "the review"
        )
        page = browser.get(f"{base}/workflows/{_at('refunds/A1')}").text
        [approve] = [t for t in _targets(page) if t.endswith("/approve")]
        expect = re.search(r'name="expect" value="([^"]+)"', page)
        back = re.search(r'name="back" value="([^"]+)"', page)
        assert expect is not None and back is not None, page
        r = browser.post(
            base + approve,
            data={"csrf_token": _csrf(page), "expect": expect[1], "back": back[1]},
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        shown = browser.get(base + r.headers["location"])
        assert shown.status_code == 200 and "refunds/A1</h1>" in shown.text, shown.text
        harness.until(lambda: client.get_workflow("refunds/A1").finished, "the refund to end")

        reviews = browser.get(base + "/reviews").text
        [resolve] = [t for t in _targets(reviews) if t.endswith("/resolve")]
        assert resolve == f"/workflows/{_at('transfers/T1')}/reviews/1/resolve", resolve
        r = browser.post(
            base + resolve,
            data={"csrf_token": _csrf(reviews), "decision": "retry", "back": "/reviews"},
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        harness.until(lambda: client.get_workflow("transfers/T1").finished, "the transfer")
    assert client.get_workflow("refunds/A1").output == '{"refund_id":"re_A1","cents":500}'
    assert client.get_workflow("transfers/T1").status == "completed"
    assert auth.COOKIE in browser.cookies
