"""Login CSRF, against a real ``durably serve`` on 127.0.0.1 and in a real Chromium.

Login CSRF: another site's page posts the login form with the attacker's token,
and the victim's browser is then logged in as the attacker (their decisions
recorded under the attacker's name). The login form carries a token bound to a
pre-session cookie the login page sets (SameSite=Strict, so a cross-site post
never carries it); a post without the pair is refused with 403 and logs no one in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import durably
from durably.server import auth
from tests.serverkit import harness
from tests.test_server_browser import chromium, launched  # noqa: F401 (the fixture)

#: The attacker's own token: a valid one, with its own name.
MALLORY = "mallory:mallory-token-0123456789abcdef"
MALLORY_SECRET = "mallory-token-0123456789abcdef"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real server for the module, accepting alice's token and mallory's."""
    folder = tmp_path_factory.mktemp("login")
    tokens = folder / "tokens"
    tokens.write_text(f"{harness.TOKEN}\n{MALLORY}\n")
    url = f"sqlite:///{folder / 'durably.db'}"
    durably.Client(url).start("srv-wait", workflow_id="w")
    with harness.server(url, args=["--token-file", str(tokens)]) as served:
        yield served


def _field(html: str) -> str:
    """The login form's token ("" where the form has none)."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    return found[1] if found else ""


def test_a_login_post_without_the_login_page_s_cookie_is_refused(base: str) -> None:
    """A cross-site post (no pre-session cookie: SameSite=Strict keeps it home), with or
    without a form token copied from the attacker's own login page, is a 403 that
    sets no session."""
    with httpx.Client(timeout=10) as attacker:
        copied = _field(attacker.get(base + "/login").text)
    for form in (
        {"token": MALLORY_SECRET},
        {"token": MALLORY_SECRET, auth.CSRF_FIELD: copied},
    ):
        r = httpx.post(
            base + "/login",
            data=form,
            headers={"Origin": "https://evil.example", "Referer": "https://evil.example/"},
            follow_redirects=False,
            timeout=10,
        )
        assert r.status_code == 403, (form, r.status_code, r.text)
        assert auth.COOKIE not in r.cookies, r.headers
        assert "log in again" in r.text.lower(), r.text


def test_a_login_post_whose_form_token_does_not_match_its_cookie_is_refused(base: str) -> None:
    """The victim's own pre-session cookie with the attacker's form token is refused too."""
    with httpx.Client(timeout=10) as victim, httpx.Client(timeout=10) as attacker:
        victim.get(base + "/login")
        theirs = _field(attacker.get(base + "/login").text)
        r = victim.post(
            base + "/login",
            data={"token": MALLORY_SECRET, auth.CSRF_FIELD: theirs},
            follow_redirects=False,
        )
        assert r.status_code == 403 and auth.COOKIE not in r.cookies, r.text
        assert victim.get(base + "/api/summary").status_code == 401


def test_the_login_form_logs_in_with_its_pre_session_cookie(base: str) -> None:
    """The login page sets an HttpOnly, SameSite=Strict cookie for /login only and puts
    its token in the form; posting the form logs in and drops the cookie."""
    with httpx.Client(timeout=10) as browser:
        page = browser.get(base + "/login?next=/workflows/w")
        assert page.status_code == 200
        cookie = page.headers["set-cookie"]
        assert cookie.startswith(auth.LOGIN_COOKIE + "="), cookie
        for part in ("HttpOnly", "Path=/login"):
            assert part in cookie, cookie
        assert "samesite=strict" in cookie.lower(), cookie
        r = harness.login(browser, base, next="/workflows/w")
        assert r.status_code == 303 and r.headers["location"] == "/workflows/w", r.text
        assert auth.COOKIE in browser.cookies
        assert auth.LOGIN_COOKIE not in browser.cookies
        assert browser.get(base + "/api/summary").status_code == 200
        # a wrong token on a good form is still the form, refused as before (401)
        browser.cookies.clear()
        r = harness.login(browser, base, token="wrong-token-0123456789")
        assert r.status_code == 401 and "not valid" in r.text


def test_the_name_field_is_required_only_where_a_token_has_no_name(base: str) -> None:
    """Every token of this server names its person: the login form asks no name of
    anyone (the browser test of a bare token's form is in test_dashboard_pages_browser)."""
    page = httpx.get(base + "/login", timeout=10).text
    field = re.search(r"<input name=\"name\"[^>]*>", page)
    assert field is not None and "required" not in field[0], page


def test_another_site_cannot_log_a_real_browser_in(
    chromium: None,  # noqa: F811 (the fixture)
    base: str,
    tmp_path: Path,
) -> None:
    """A page of another site that submits the login form with mallory's token, opened
    in Chromium, leaves the browser logged out; alice then logs in as herself."""
    attack = f"""<!doctype html><html><body>
<form id="f" method="post" action="{base}/login">
  <input name="token" value="{MALLORY_SECRET}"><input name="next" value="/">
</form>
<script>document.getElementById("f").submit();</script></body></html>"""
    with launched() as browser:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.route(
            "http://evil.test/**",
            lambda route: route.fulfill(status=200, content_type="text/html", body=attack),
        )
        with page.expect_response(lambda r: r.url == base + "/login") as posted:
            page.goto("http://evil.test/")
        names = {c["name"] for c in context.cookies(base)}
        assert auth.COOKIE not in names, names  # not logged in as mallory
        assert posted.value.status == 403
        page.goto(base + "/")
        assert "/login" in page.url, page.url
        page.fill("input[name=token]", harness.SECRET)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        assert "alice" in page.inner_text("header"), page.content()
