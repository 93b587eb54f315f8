"""What an operator reads on the dashboard, in a real headless Chromium over a real
``durably serve``: a failed workflow's error, what a parked one waits for, and pages
that fit a phone's width (420 px) without scrolling sideways.

The workflows ran on a real engine first (tests.serverkit.flows). One server, one
browser and one logged-in page serve the whole module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from tests.serverkit import flows, harness
from tests.test_server_browser import artifacts, launched, require_browser  # noqa: F401

#: A phone's width: the review found the top bar and the filters overflowing at it.
NARROW = 420


def parked(url: str) -> None:
    """fail-1 (failed in its step), sleep-1 (an hour's sleep), wait-1 (a signal 'go',
    with a day's timeout) and wait-2 (a signal 'go', no timeout), run by a real engine
    until each failed or parked."""

    async def main() -> None:
        async with durably.Engine(url, poll_interval=0.05) as engine:
            failing = await engine.start(flows.fail_flow, "O-7", workflow_id="fail-1")
            with pytest.raises(ValueError):
                await failing.result(timeout=20)
            await engine.start(flows.sleep_flow, 3600, workflow_id="sleep-1")
            await engine.start(flows.wait_flow, 86_400, workflow_id="wait-1")
            await engine.start(flows.wait_flow, workflow_id="wait-2")
            for wid in ("sleep-1", "wait-1", "wait-2"):
                while (await engine.get_workflow(wid)).status in ("pending", "running"):
                    await asyncio.sleep(0.02)

    asyncio.run(main())


@dataclasses.dataclass
class Site:
    base: str
    page: Any


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A Chromium page logged in to a server over the parked workflows (1280 px wide)."""
    require_browser()
    url = f"sqlite:///{tmp_path_factory.mktemp('pages') / 'durably.db'}"
    parked(url)
    # a bare token, without a name of its own: a person logs in with theirs
    bare = {"DURABLY_API_TOKEN": harness.SECRET}
    with harness.server(url, bare) as base, launched() as browser:
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.set_default_timeout(20_000)
        tab.goto(base + "/login")
        tab.fill("input[name=token]", harness.SECRET)
        tab.fill("input[name=name]", "alice")
        tab.click("button[type=submit]")
        tab.wait_for_url(base + "/")
        yield Site(base, tab)


def _sideways(page: Any) -> int:
    """How many pixels the page is wider than its window (0: no sideways scroll)."""
    width: int = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    return width


def test_the_login_form_requires_a_name(site: Site) -> None:
    """The server refuses a login without a name; the form says so before it is sent."""
    context = site.page.context.browser.new_context()
    try:
        other = context.new_page()
        other.goto(site.base + "/login")
        assert other.evaluate("document.querySelector('input[name=name]').required")
        other.fill("input[name=token]", harness.SECRET)
        other.click("button[type=submit]")
        assert "/login" in other.url  # the browser kept the form: the name is missing
        assert not other.evaluate("document.querySelector('input[name=name]').validity.valid")
    finally:
        context.close()


def test_no_page_scrolls_sideways_at_420_px(site: Site, artifacts: Path) -> None:  # noqa: F811
    """At 420 px the top bar, the list's filters and a workflow's page wrap; a wide
    table scrolls inside its own box, the page body never sideways."""
    page = site.page
    page.set_viewport_size({"width": NARROW, "height": 900})
    try:
        for path in ("/", "/workflows/fail-1", "/workflows/wait-1", "/approvals", "/workers"):
            page.goto(site.base + path)
            shot = "narrow" + (path.replace("/", "-") if path != "/" else "-list") + ".png"
            page.screenshot(path=str(artifacts / shot), full_page=True)
            assert _sideways(page) <= 0, (path, _sideways(page))
            # the top bar holds its links, the name and Log out inside its dark band
            bar = page.locator("header.top").bounding_box()
            for part in ("header.top nav a >> nth=-1", "header.top .me button"):
                box = page.locator(part).bounding_box()
                assert box["y"] + box["height"] <= bar["y"] + bar["height"] + 0.5, (path, part)
                assert box["x"] + box["width"] <= NARROW, (path, part)
        page.goto(site.base + "/")
        button = page.locator("form.filters button").bounding_box()
        assert button["x"] + button["width"] <= NARROW
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


def test_a_failed_workflow_shows_its_error_and_whole_traceback(
    site: Site,
    artifacts: Path,  # noqa: F811 (the fixture)
) -> None:
    """The error's type and message as a headline, the traceback as lines (folded
    away until asked for), whole; the failed step's cell says the same in one line."""
    page = site.page
    page.goto(site.base + "/workflows/fail-1")
    said = "ValueError: card declined for O-7"
    assert page.inner_text(".failure .error-head") == said
    assert page.evaluate("document.querySelector('.failure details').open") is False
    assert not page.locator(".failure pre.traceback").is_visible()
    page.click(".failure summary")
    shown = page.inner_text(".failure pre.traceback")
    lines = shown.splitlines()
    assert lines[0] == "Traceback (most recent call last):", lines[:2]
    assert lines[-1] == said, lines[-3:]  # whole, to its last line
    assert 'File "' in shown and "\\n" not in shown and '\\"' not in shown
    assert page.inner_text("table.timeline tr.st-failed td.preview") == said
    page.screenshot(path=str(artifacts / "failed.png"), full_page=True)


WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_a_parked_workflow_says_what_it_waits_for(site: Site) -> None:
    """Under the head, in words: the signal and since when (and its timeout), or the
    time a sleep ends and how far off it is."""
    page = site.page
    page.goto(site.base + "/workflows/wait-1")
    said = page.inner_text(".waits")
    assert re.fullmatch(
        rf"Waiting for signal 'go' since {WHEN}; times out at {WHEN} \(in 24\.0 h\)", said
    ), said
    page.goto(site.base + "/workflows/wait-2")
    assert re.fullmatch(rf"Waiting for signal 'go' since {WHEN}", page.inner_text(".waits"))
    page.goto(site.base + "/workflows/sleep-1")
    said = page.inner_text(".waits")
    assert re.fullmatch(rf"Sleeping until {WHEN} \(in (59|60) min\)", said), said
    page.goto(site.base + "/workflows/fail-1")
    assert page.locator(".waits").count() == 0


def test_send_a_signal_from_a_waiting_workflow_s_page(site: Site) -> None:
    """The form is named for the signal waited for; a payload that is not JSON is
    refused with words that say so, a good one is listed with the signals (no engine
    runs here: tests/test_dashboard_waits.py sees one delivered)."""
    page = site.page
    page.goto(site.base + "/workflows/wait-2")
    assert page.input_value("form.send-signal input[name=name]") == "go"
    page.fill("form.send-signal textarea[name=payload]", "{approved: yes}")
    page.click("form.send-signal button")
    page.wait_for_selector("#flash:not([hidden])")
    assert "the payload is not JSON" in page.inner_text("#flash")
    page.fill("form.send-signal textarea[name=payload]", '{"approved": true}')
    page.click("form.send-signal button")
    page.wait_for_selector("#flash", state="hidden")
    row = page.locator("section:has(h2:text('Signals')) tbody tr").first
    assert "go" in row.inner_text() and '"approved": true' in row.inner_text()


def _signal_through_the_api(site: Site, workflow_id: str, name: str) -> None:
    import httpx

    sent = httpx.post(
        f"{site.base}/api/workflows/{workflow_id}/signals",
        json={"name": name, "payload": 1},
        headers={"Authorization": f"Bearer {harness.SECRET}"},
    )
    assert sent.status_code == 200, sent.text


def _until(page: Any, expression: str, seconds: float = 20.0) -> None:
    """Wait until ``expression`` is true in the page (wait_for_function evaluates a string,
    which the dashboard's Content-Security-Policy refuses)."""
    deadline = time.monotonic() + seconds
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {seconds} s: {expression}"
        page.wait_for_timeout(50)


def _until_swapped(page: Any, seen: int) -> None:
    _until(page, f"Number(document.body.dataset.refreshed || 0) > {seen}")


def _swaps(page: Any) -> int:
    count: int = page.evaluate("Number(document.body.dataset.refreshed || 0)")
    return count


def test_what_is_typed_survives_a_live_update(site: Site) -> None:
    """The page swaps in fresh HTML whenever its workflow changes (here: a signal sent to
    it through the API while a person types a payload): the half-typed payload and its
    focus stay as they were. A payload refused stays to be mended; one sent clears."""
    page = site.page
    page.goto(site.base + "/workflows/wait-1")
    _until(page, "document.body.dataset.live !== undefined")
    page.fill("form.send-signal textarea[name=payload]", '{"half": ')
    seen = _swaps(page)
    _signal_through_the_api(site, "wait-1", "other")
    _until_swapped(page, seen)
    assert "other" in page.inner_text("section:has(h2:text('Signals'))")  # swapped in
    assert page.input_value("form.send-signal textarea[name=payload]") == '{"half": '
    assert page.evaluate("document.activeElement.name") == "payload"
    page.click("form.send-signal button")  # not JSON: refused, and kept to be mended
    page.wait_for_selector("#flash:not([hidden])")
    assert page.input_value("form.send-signal textarea[name=payload]") == '{"half": '
    page.fill("form.send-signal textarea[name=payload]", '{"half": 2}')
    page.click("form.send-signal button")
    page.wait_for_selector("#flash", state="hidden")
    _until(page, "document.querySelector('form.send-signal textarea[name=payload]').value === ''")
