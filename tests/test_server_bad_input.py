"""Bad input sent to a real ``durably serve``: a clear 4xx that changes nothing, never a 500.

One server process on a SQLite file serves every test here (real HTTP on 127.0.0.1);
each test uses its own workflow ids.
"""

from __future__ import annotations

import base64
import concurrent.futures
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import durably
from durably import cli, journal
from durably.agents.approvals import INDEX_EVENT
from durably.server import auth, views
from durably.storage import create_store
from durably.storage.base import NewWorkflow
from tests.serverkit import flows, harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}
#: JSON nested deeper than the standard library's decoder follows (its recursion limit),
#: short enough for a URL or a cookie.
DEEP = "[" * 2_000 + "]" * 2_000


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The database the module's server serves."""
    return f"sqlite:///{tmp_path_factory.mktemp('bad-input') / 'durably.db'}"


@pytest.fixture(scope="module")
def base(url: str) -> Iterator[str]:
    """The base URL of one real server for the whole module."""
    durably.Client(url).start("srv-wait", workflow_id="w")
    with harness.server(url) as served:
        yield served


def _session(base: str) -> str:
    """A valid session cookie of the server at ``base`` (logged in with the test token)."""
    with httpx.Client(timeout=10) as browser:
        r = harness.login(browser, base)
    assert r.status_code == 303
    return str(r.cookies[auth.COOKIE])


def test_a_json_body_nested_past_the_decoders_limit_is_a_422_that_starts_nothing(
    base: str, url: str
) -> None:
    """A body of JSON nested too deep to decode is bad input (422), not a 500."""
    r = httpx.post(base + "/api/workflows", content=DEEP, headers=BEARER, timeout=10)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "BadInput"
    r = httpx.post(base + "/api/workflows/w/signals", content=DEEP, headers=BEARER, timeout=10)
    assert r.status_code == 422, r.text
    client = durably.Client(url)
    assert [w.workflow_id for w in client.list_workflows()] == ["w"]
    assert client.signals("w") == []


def test_a_cursor_nested_past_the_decoders_limit_is_a_422(base: str) -> None:
    """A cursor this API never returned is a 422 naming it, however deep its JSON."""
    cursor = base64.urlsafe_b64encode(DEEP.encode()).decode()
    r = httpx.get(base + "/api/workflows", params={"cursor": cursor}, headers=BEARER, timeout=10)
    assert r.status_code == 422, r.text
    assert "cursor" in r.json()["error"]["message"]
    cookie = {auth.COOKIE: _session(base)}
    r = httpx.get(base + "/", params={"cursor": cursor}, cookies=cookie, timeout=10)
    assert r.status_code == 200 and "is not one this API returned" in r.text


def test_a_garbled_session_cookie_is_refused_not_a_500(base: str) -> None:
    """A cookie that is no session (JSON nested too deep, a signature of non-ASCII
    characters) is refused as no session: 401 from the API, the login page from the
    dashboard."""
    deep = base64.urlsafe_b64encode(DEEP.encode()).decode().rstrip("=") + ".00"
    good = _session(base)
    data, _, _ = good.rpartition(".")
    accented = f"{auth.COOKIE}={data}.\u00e9".encode("latin-1")
    for cookie in (f"{auth.COOKIE}={deep}".encode(), accented):
        r = httpx.get(base + "/api/summary", headers={"Cookie": cookie}, timeout=10)
        assert r.status_code == 401, r.text
        r = httpx.get(base + "/", headers={"Cookie": cookie}, follow_redirects=False, timeout=10)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), r.text


@pytest.mark.parametrize("key", ["timeout", "delay", "max_recoveries", "workflow_id"])
def test_kwargs_named_as_a_start_option_are_a_422_that_starts_nothing(
    base: str, url: str, key: str
) -> None:
    """A workflow keyword argument named as one of Client.start's own options cannot be
    passed as one: it is refused naming it, rather than taken as that option (a
    ``timeout`` kwarg became the workflow's deadline, and was not passed)."""
    wid = f"kw-{key}"
    body = {"workflow": "srv-wait", "workflow_id": wid, "kwargs": {key: 5}}
    r = httpx.post(base + "/api/workflows", json=body, headers=BEARER, timeout=10)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "BadInput" and repr(key) in r.json()["error"]["message"]
    with pytest.raises(durably.WorkflowNotFound):
        durably.Client(url).get_workflow(wid)


def test_serve_prints_the_database_url_without_its_password() -> None:
    """The line ``durably serve`` prints (into terminals and service logs) names the
    database without the password of its URL, as every message of durably does."""
    port = harness.free_port()
    url = f"postgresql://app:sekrit-pw-1234@127.0.0.1:{harness.free_port()}/app"
    args = [sys.executable, "-m", "durably.cli", "--database", url, "serve", "--port", str(port)]
    with harness.process(args, {"DURABLY_API_TOKEN": harness.TOKEN}) as proc:
        out, _ = proc.communicate(timeout=30)  # nothing listens there: it exits at startup
    assert "serving postgresql://app:***@127.0.0.1:" in out, out
    assert "sekrit-pw-1234" not in out, out


def test_a_workflow_id_with_dot_segments_links_and_posts_to_itself_only(
    base: str, url: str
) -> None:
    """A workflow id such as ``../workflows/victim`` is one path segment in every link and
    form of the dashboard: a browser resolving ``/workflows/../workflows/victim/...``
    would send a person's click (open, resolve a review) to the workflow ``victim``."""
    durably.Client(url).start("srv-wait", workflow_id="victim")
    harness.park_for_review(url, "../workflows/victim", "ORD-DOT")
    cookie = {auth.COOKIE: _session(base)}
    with harness.engine_thread(url):
        harness.until(
            lambda: "../workflows/victim" in httpx.get(base + "/reviews", cookies=cookie).text,
            "the review to open",
        )
    for page in ("/", "/reviews"):
        html = httpx.get(base + page, cookies=cookie).text
        targets = re.findall(r'(?:href|action)="(/[^"]*)"', html)
        assert any("reviews/1/resolve" in t for t in targets) or page == "/", html
        for target in targets:
            # what a browser requests for the link: dot segments removed
            assert urllib.parse.urljoin(base + page, target) == base + target, (page, target)


def test_a_payload_nested_too_deep_to_decode_is_its_text_in_the_api_and_a_note_on_the_page(
    base: str, url: str
) -> None:
    """Payloads nested past what the server decodes never make a 500: a step result and
    an output as deep as the codec writes (970 lists, run by a real engine), a signal as
    deep, and an input of 100,000 nested lists (JSON text another client wrote). The
    API answers with each payload's stored text; the page says it is not shown."""
    client = durably.Client(url)
    client.start("srv-deep", 970, workflow_id="deep-result")
    with harness.engine_thread(url):
        harness.until(lambda: client.get_workflow("deep-result").finished, "srv-deep to end")
    assert client.get_workflow("deep-result").status == "completed"
    deepest = "[" * 100_000 + "]" * 100_000
    client.submit(NewWorkflow("deep-input", "srv-wait", deepest, None, None))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh thread's stack, as deep
        pool.submit(client.send_signal, "deep-input", "note", flows.nested(970)).result()
    stored = client.get_workflow("deep-result").output
    assert stored is not None and stored.startswith("[" * 970)

    at = base + "/api/workflows/"
    r = httpx.get(at + "deep-result", headers=BEARER, timeout=10)
    assert r.status_code == 200 and r.json()["output"] == stored, r.text[:300]
    r = httpx.get(at + "deep-result/history", headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text[:300]
    assert [e["payload"] for e in r.json()["entries"] if e["kind"] == "step"] == [stored]
    r = httpx.get(at + "deep-input", headers=BEARER, timeout=10)
    assert r.status_code == 200 and r.json()["input"] == deepest, r.text[:300]
    for route in ("deep-input/signals", "deep-input/history"):
        r = httpx.get(at + route, headers=BEARER, timeout=10)
        assert r.status_code == 200, (route, r.text[:300])
        assert [s["payload"] for s in r.json()["signals"]] == [stored], route
    r = httpx.get(base + "/api/workflows", headers=BEARER, timeout=10)
    assert r.status_code == 200 and deepest in [w["input"] for w in r.json()["workflows"]]

    cookie = {auth.COOKIE: _session(base)}
    for wid, shown in (("deep-result", 1), ("deep-input", 2)):  # its output; input and signal
        r = httpx.get(base + "/workflows/" + wid, cookies=cookie, timeout=10)
        assert r.status_code == 200, (wid, r.text[:300])
        assert r.text.count(views.TOO_DEEP.split("{")[0]) >= shown, (wid, r.text)


def test_a_result_typed_nested_too_deep_to_decode_is_a_422_that_resolves_nothing(
    base: str, url: str
) -> None:
    """A review's result typed on the page as JSON nested past what the decoder follows
    is refused (422, naming why), not taken as a text result, and the review stays open."""
    harness.park_for_review(url, "deep-review", "ORD-DEEP")
    client = durably.Client(url)
    with harness.engine_thread(url):
        harness.until(
            lambda: client.get_workflow("deep-review").status == "needs_review", "the review"
        )
    cookie = {auth.COOKIE: _session(base)}
    page = httpx.get(base + "/workflows/deep-review", cookies=cookie, timeout=10).text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf is not None, page
    r = httpx.post(
        base + "/workflows/deep-review/reviews/1/resolve",
        data={"csrf_token": csrf[1], "decision": "result", "result": DEEP},
        cookies=cookie,
        timeout=10,
    )
    assert r.status_code == 422 and "nested too deep" in r.text, r.text[:300]
    [review] = client.reviews("deep-review")
    assert review.decision is None


def test_an_approval_nested_too_deep_is_listed_with_a_note_beside_the_others(
    base: str, url: str
) -> None:
    """A tool call awaiting approval with arguments nested past what the server shows
    (600 lists, and 970: as deep as the codec writes) never makes a 500 of the approvals
    list, of the API's or of its workflow's page, nor fails ``durably approvals``: it is
    listed, to be decided, its arguments replaced by a note, beside the others as they
    are."""
    client = durably.Client(url)
    client.start("srv-refund", "ORD-NEAR", 100, workflow_id="appr-near")
    deep = {f"appr-deep-{depth}": depth for depth in (600, 970)}
    for wid, depth in deep.items():
        client.start("srv-deep-approval", depth, workflow_id=wid)
    with harness.engine_thread(url):
        harness.until(
            lambda: all(client.get_workflow(w).status == "waiting" for w in ["appr-near", *deep]),
            "the approvals to park",
        )
    note = views.TOO_DEEP.split("{")[0]

    r = httpx.get(base + "/api/approvals", headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text[:300]
    listed = {a["workflow_id"]: a for a in r.json()["approvals"]}
    assert listed["appr-near"]["arguments"] == {"order_id": "ORD-NEAR", "cents": 100}
    for wid in deep:
        assert listed[wid]["arguments"].startswith(note), listed[wid]
        assert listed[wid]["call"] == "ship(…)" and len(listed[wid]["args_sha256"]) == 64

    cookie = {auth.COOKIE: _session(base)}
    r = httpx.get(base + "/approvals", cookies=cookie, timeout=10)
    assert r.status_code == 200, r.text[:300]
    for wid in ["appr-near", *deep]:
        assert f'href="/workflows/{wid}"' in r.text, wid
    assert "ORD-NEAR" in r.text and r.text.count(note) >= 2
    for wid in deep:
        r = httpx.get(base + "/workflows/" + wid, cookies=cookie, timeout=10)
        assert r.status_code == 200 and note in r.text, (wid, r.text[:300])

    for args, shown in ((["approvals"], "ship(…)"), (["approvals", "--json"], note)):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh stack, a shell's
            out = pool.submit(CliRunner().invoke, cli.main, ["--database", url, *args]).result()
        assert out.exit_code == 0, (args, out.output[-300:], out.exception)
        assert "ORD-NEAR" in out.output and out.output.count(shown) == 2, out.output[-300:]


def test_approvals_that_cannot_be_decoded_leave_the_others_listed(
    base: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A workflow's pending approvals stored as JSON nested deeper than the decoder
    follows (as another writer, or an import, may leave them: the codec writes none)
    failed every listing of approvals with its DecodeError: a 500 of the approvals page
    and of its workflow's page, a 422 of GET /api/approvals, `durably approvals` exit 1.
    Now that workflow's approvals are left out of a listing, with a warning naming it,
    and the others are listed."""
    client = durably.Client(url)
    client.start("srv-refund", "ORD-BESIDE", 100, workflow_id="appr-beside")
    client.start("srv-wait", workflow_id="appr-unread")
    with harness.engine_thread(url):
        harness.until(
            lambda: all(
                client.get_workflow(w).status == "waiting" for w in ("appr-beside", "appr-unread")
            ),
            "the workflows to park",
        )
    store: Any = create_store(url)
    store.open()
    try:  # the event row as another writer left it
        store._begin(True)
        store._q("publish_event", workflow_id="appr-unread", key=INDEX_EVENT,
                 value="[" * 100_000 + "]" * 100_000, seq=1_000, now=time.time())  # fmt: skip
        store._commit()
    finally:
        store.close()

    r = httpx.get(base + "/api/approvals", headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text[:300]
    listed = [a["workflow_id"] for a in r.json()["approvals"]]
    assert "appr-beside" in listed and "appr-unread" not in listed
    r = httpx.get(base + "/api/approvals?workflow_id=appr-unread", headers=BEARER, timeout=10)
    assert r.status_code == 200 and r.json()["approvals"] == [], r.text[:300]
    cookie = {auth.COOKIE: _session(base)}
    for page in ("/approvals", "/workflows/appr-unread"):
        r = httpx.get(base + page, cookies=cookie, timeout=10)
        assert r.status_code == 200, (page, r.text[:300])
    with caplog.at_level(logging.WARNING, "durably.agents"):
        out = CliRunner().invoke(cli.main, ["--database", url, "approvals"])
    assert out.exit_code == 0, out.output[-300:]
    assert "ORD-BESIDE" in out.output and "appr-unread" not in out.output
    assert "approvals of workflow 'appr-unread' not listed: cannot decode" in caplog.text


def test_a_model_call_that_cannot_be_decoded_is_shown_without_its_usage(
    base: str, url: str
) -> None:
    """A model call's answer stored as JSON nested deeper than the decoder follows (as
    another writer, or an import, may leave it: the codec writes none) failed the usage
    its workflow's timeline sums with a DecodeError: a 500 of its page, a 422 of its
    history, `durably show` exit 1. Now its row shows without tokens, and the usage
    line says why it is not shown."""
    durably.Client(url).start("srv-wait", workflow_id="llm-unread")
    answer = journal.Entry(0, journal.Kind.STEP, "llm:model", journal.EntryStatus.COMPLETED,
                           1, "[" * 100_000 + "]" * 100_000, time.time())  # fmt: skip
    store: Any = create_store(url)
    store.open()
    try:  # the journal entry as another writer left it
        store._begin(True)
        store._upsert("llm-unread", [answer], time.time(), None)
        store._commit()
    finally:
        store.close()

    r = httpx.get(base + "/api/workflows/llm-unread/history", headers=BEARER, timeout=10)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"].startswith("model usage: not shown (cannot decode model call")
    assert r.json()["timeline"][0]["tokens"] is None
    cookie = {auth.COOKIE: _session(base)}
    r = httpx.get(base + "/workflows/llm-unread", cookies=cookie, timeout=10)
    assert r.status_code == 200 and "model usage: not shown" in r.text, r.text[:300]
    for args in (["show", "llm-unread"], ["show", "llm-unread", "--json"]):
        out = CliRunner().invoke(cli.main, ["--database", url, *args])
        assert out.exit_code == 0, (args, out.output[-300:])
        assert "model usage: not shown" in out.output, (args, out.output[-300:])
