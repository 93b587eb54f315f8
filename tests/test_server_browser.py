"""The dashboard in a real headless Chromium, over a real ``durably serve`` and real workers.

Logs in, approves a refund and watches it complete without a reload, resolves
a review item from the page, and finds the gap in the timeline of a workflow
whose worker was killed with SIGKILL and recovered by another. A screenshot of
each page goes to ``$DURABLY_ARTIFACTS`` (default: a temporary folder).

Skips when Chromium (/usr/bin/chromium) or Playwright is missing, unless
``DURABLY_REQUIRE_BROWSER=1``, which makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import durably
from tests.serverkit import harness

CHROMIUM = "/usr/bin/chromium"
BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = Path(os.environ.get("DURABLY_ARTIFACTS") or tempfile.mkdtemp(prefix="durably-shots-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"screenshots in {folder}")
    return folder


@pytest.fixture
def chromium() -> None:
    """Skip (or fail, under DURABLY_REQUIRE_BROWSER=1) without Chromium and Playwright."""
    require_browser()


def require_browser() -> None:
    """Skip (or fail, under DURABLY_REQUIRE_BROWSER=1) without Chromium and Playwright."""
    missing = _missing()
    if missing:
        if os.environ.get("DURABLY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DURABLY_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)


@contextlib.contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium driven by Playwright (its own event loop: start it after asyncio)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            browser.close()


def _api(base: str, path: str) -> Any:
    r = httpx.get(base + path, headers=BEARER, timeout=10)
    r.raise_for_status()
    return r.json()


def _status(base: str, wid: str) -> str:
    status: str = _api(base, f"/api/workflows/{wid}")["status"]
    return status


def _crash_and_recover(url: str, tmp: Path) -> None:
    """srv-crash: its worker is SIGKILLed inside the second step; another worker finishes it."""
    flag = tmp / "hold"
    flag.write_text("hold")
    client = durably.Client(url)
    client.start("srv-crash", "C1", str(flag), workflow_id="crashed")
    with harness.worker(url, lease=1.0) as first:
        harness.until(lambda: Path(str(flag) + ".started").exists(), "the charge step to start")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    flag.unlink()


def test_approve_resolve_and_the_gap_in_a_real_browser(
    chromium: None, artifacts: Path, sqlite_url: str, tmp_path: Path
) -> None:
    harness.park_for_review(sqlite_url, "transfer-T1", "T1")
    _crash_and_recover(sqlite_url, tmp_path)
    client = durably.Client(sqlite_url)
    client.start("srv-refund", "A1", 12_000, workflow_id="refund-A1")
    with (
        harness.worker(sqlite_url, lease=1.0),
        harness.server(sqlite_url) as base,
        launched() as browser,
    ):
        harness.until(lambda: _api(base, "/api/approvals")["approvals"], "the refund approval")
        harness.until(lambda: _status(base, "transfer-T1") == "needs_review", "the review")
        harness.until(lambda: _status(base, "crashed") == "completed", "the crashed one to recover")
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.set_default_timeout(20_000)

        # log in: the list page, with its counts
        page.goto(base + "/")
        assert "/login" in page.url
        page.screenshot(path=str(artifacts / "01-login.png"))
        page.fill("input[name=token]", harness.SECRET)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        page.wait_for_selector("text=refund-A1")
        page.screenshot(path=str(artifacts / "02-workflows.png"), full_page=True)

        # approve the refund and watch it complete without a reload
        page.goto(base + "/workflows/refund-A1")
        page.wait_for_selector(".approval")
        assert "12000" in page.inner_text(".approval pre.args")
        page.evaluate("window.__same_page = true")
        # live updates come by server-sent events, not by polling
        assert page.evaluate("document.body.dataset.live") == "events"
        page.screenshot(path=str(artifacts / "03-approval.png"), full_page=True)
        page.click(".approval button:has-text('Approve')")
        page.wait_for_selector("#status .s-completed")
        assert page.evaluate("window.__same_page === true"), "the page was reloaded"
        assert page.locator(".approval").count() == 0
        page.wait_for_selector("text=re_A1")
        page.screenshot(path=str(artifacts / "04-approved.png"), full_page=True)
        assert _status(base, "refund-A1") == "completed"
        [decision] = _api(base, "/api/workflows/refund-A1/history")["signals"]
        assert decision["payload"]["by"] == "alice"

        # resolve the review item from the review queue
        page.goto(base + "/reviews")
        page.wait_for_selector(".review")
        page.evaluate("window.__same_page = true")
        page.screenshot(path=str(artifacts / "05-reviews.png"), full_page=True)
        page.check(".review input[value=retry]")
        page.click(".review button:has-text('Resolve')")
        page.wait_for_selector("text=No step awaits review")
        assert page.evaluate("window.__same_page === true"), "the page was reloaded"
        harness.until(lambda: _status(base, "transfer-T1") == "completed", "the transfer to end")
        assert _api(base, "/api/workflows/transfer-T1")["output"] == {"transfer_id": "tr_T1"}

        # the crashed-and-recovered workflow: a gap, and the replayed step marked
        page.goto(base + "/workflows/crashed")
        page.wait_for_selector("tr.gap")
        assert "the process was dead here" in page.inner_text("tr.gap")
        assert "replayed" in page.inner_text("tr.replayed")
        page.screenshot(path=str(artifacts / "06-crashed.png"), full_page=True)

        page.goto(base + "/workers")
        page.wait_for_selector("table.grid")
        page.screenshot(path=str(artifacts / "07-workers.png"), full_page=True)


def test_list_filters_and_a_fork_s_origin_in_a_real_browser(
    chromium: None, artifacts: Path, sqlite_url: str
) -> None:
    """Type into the list's filters (id prefix, then parent) and follow a fork to its origin."""
    from tests.test_dashboard_filters import family

    family(sqlite_url)
    with harness.server(sqlite_url) as base, launched() as browser:
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.set_default_timeout(20_000)
        page.goto(base + "/")
        page.fill("input[name=token]", harness.SECRET)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")

        def listed() -> list[str]:
            return sorted(page.locator("table.grid td a.mono").all_inner_texts())

        assert listed() == ["order-P1", "order-P1-child", "order-P1-fork", "other-Q1"]
        page.fill("input[name=id_prefix]", "order-P1-")
        page.click("form.filters button")
        page.wait_for_url("**id_prefix=order-P1-**")
        assert listed() == ["order-P1-child", "order-P1-fork"]
        page.fill("input[name=id_prefix]", "")
        page.fill("input[name=parent]", "order-P1")
        page.click("form.filters button")
        page.wait_for_url("**parent=order-P1**")
        assert listed() == ["order-P1-child"]
        page.screenshot(path=str(artifacts / "08-filtered.png"), full_page=True)

        page.goto(base + "/workflows/order-P1-fork")
        assert "forked from order-P1 at seq 1" in page.inner_text(".forked")
        page.screenshot(path=str(artifacts / "09-fork.png"), full_page=True)
        page.click(".forked a")
        page.wait_for_url(base + "/workflows/order-P1")
        assert page.locator(".forked").count() == 0


def test_a_long_journal_pages_and_stays_on_its_page_when_it_grows_in_a_real_browser(
    chromium: None, artifacts: Path, sqlite_url: str
) -> None:
    """A running workflow of 450 entries shows its newest 200; 'earlier' goes back a page;
    ten more entries journaled meanwhile update the count on that page, live, without
    leaving it; 'newest' shows them."""
    from durably.storage import base, create_store
    from tests.test_history_pages import NAME, T, _entry
    from tests.test_queries import Verbs

    store = create_store(sqlite_url)
    store.open()
    db = Verbs(store)
    new = base.NewWorkflow("long", NAME, '{"args": [], "kwargs": {}}', None, None)
    info, _ = db.create_workflow(new, "ex-a", T + 1e9, T)
    db.append_entries("long", info.epoch, [_entry(s) for s in range(1, 451)], T + 1)
    try:
        with harness.server(sqlite_url) as base_url, launched() as browser:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.set_default_timeout(20_000)
            page.goto(base_url + "/")
            page.fill("input[name=token]", harness.SECRET)
            page.click("button[type=submit]")
            page.wait_for_url(base_url + "/")

            def seqs() -> list[int]:
                cells = page.locator("table.timeline tr[class^=st-] td.num:first-child")
                return [int(t) for t in cells.all_inner_texts()]

            def pager() -> str:
                return page.locator("p.pager").first.inner_text()

            page.goto(base_url + "/workflows/long")
            assert "200 of 450 entries (seq 251 to 450)" in pager()
            assert seqs() == list(range(251, 451))
            page.locator("p.pager").first.get_by_text("earlier").click()
            page.wait_for_url("**/workflows/long?before=251")
            assert seqs() == list(range(51, 251))
            page.screenshot(path=str(artifacts / "10-journal-page.png"), full_page=True)

            later = [_entry(s) for s in range(451, 461)]
            db.append_entries("long", info.epoch, later, T + 2)
            harness.until(lambda: "of 460 entries" in pager(), "the page's live update")
            assert page.url.endswith("/workflows/long?before=251")
            assert seqs() == list(range(51, 251))
            page.locator("p.pager").first.get_by_text("newest").click()
            page.wait_for_url(base_url + "/workflows/long")
            assert "200 of 460 entries (seq 261 to 460)" in pager()
            assert seqs()[-1] == 460
    finally:
        store.close()
