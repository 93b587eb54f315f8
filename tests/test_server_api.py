"""The JSON API of ``durably serve``: every route, its errors and its auth refusals."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durably
from durably.server import api, app, auth
from tests.serverkit import flows, harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


def make(url: str, tokens: str = harness.TOKEN) -> TestClient:
    return TestClient(app.create_app(url, auth.parse_tokens(tokens, "test")))


@pytest.fixture
def http(store_url: str) -> Iterator[TestClient]:
    with make(store_url) as c:
        c.headers.update(BEARER)
        yield c


@pytest.fixture
def sqlite_http(sqlite_url: str) -> Iterator[TestClient]:
    with make(sqlite_url) as c:
        c.headers.update(BEARER)
        yield c


def _concrete(path: str) -> str:
    return path.replace("{workflow_id}", "wf-1").replace("{seq}", "1")


# --- auth -----------------------------------------------------------------------------------


def test_every_api_route_refuses_a_request_without_a_token_or_with_a_wrong_one(
    sqlite_url: str,
) -> None:
    with make(sqlite_url) as c:
        for method, path in api.schema_routes():
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-0123456789"},
                {"Authorization": f"Basic {harness.SECRET}"},
            ):
                r = c.request(method, _concrete(path), headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["error"]["type"] == "Unauthorized"


def test_a_session_cookie_needs_its_csrf_token_to_change_anything(sqlite_url: str) -> None:
    durably.Client(sqlite_url).start("srv-wait", workflow_id="w")
    with make(sqlite_url) as c:
        r = harness.login(c, next="/")
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert c.get("/api/workflows/w").status_code == 200  # reading with the cookie is fine
        page = c.get("/workflows/w").text
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf is not None
        for method, path in api.schema_routes():
            if method == "GET":
                continue
            r = c.request(method, _concrete(path), json={})
            assert r.status_code == 403, (method, path, r.text)
            r = c.request(method, _concrete(path), json={}, headers={"X-CSRF-Token": "nope"})
            assert r.status_code == 403, (method, path, r.text)
        # the dashboard's own form actions too
        r = c.post("/workflows/w/cancel", data={}, follow_redirects=False)
        assert r.status_code == 403
        assert durably.Client(sqlite_url).get_workflow("w").cancel_requested == 0
        r = c.post("/api/workflows/w/cancel", json={}, headers={"X-CSRF-Token": csrf.group(1)})
        assert r.status_code == 200 and r.json()["by"] == "alice"


def test_a_tampered_or_foreign_session_cookie_is_refused(sqlite_url: str) -> None:
    other = auth.Auth(auth.parse_tokens("bob:another-token-0123456789", "t"))
    forged = other.make_session(other.tokens[0], "bob", time.time())
    with make(sqlite_url) as c:
        c.cookies.set(auth.COOKIE, forged)
        assert c.get("/api/summary").status_code == 401
        c.cookies.clear()
        r = harness.login(c)
        good = r.cookies[auth.COOKIE]
        assert c.get("/api/summary").status_code == 200
        data, _, sig = good.rpartition(".")
        c.cookies.clear()
        tampered = data[:-2] + ("A" if data[-2] != "A" else "B") + data[-1] + "." + sig
        c.cookies.set(auth.COOKIE, tampered)
        assert c.get("/api/summary").status_code == 401
        assert c.get("/", follow_redirects=False).status_code == 303  # to the login page


def test_login_with_a_wrong_token_is_refused_and_sets_no_cookie(sqlite_url: str) -> None:
    with make(sqlite_url) as c:
        r = harness.login(c, token="wrong-token-0123456789")
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert "not valid" in r.text


def test_an_unnamed_token_needs_a_name_at_login_and_decisions_carry_it(sqlite_url: str) -> None:
    durably.Client(sqlite_url).start("srv-wait", workflow_id="w")
    with make(sqlite_url, harness.SECRET) as c:
        r = harness.login(c)
        assert r.status_code == 401 and "name" in r.text
        r = harness.login(c, name="carol")
        assert r.status_code == 303
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', c.get("/workflows/w").text)
        assert csrf is not None
        r = c.post(
            "/workflows/w/cancel", data={"csrf_token": csrf.group(1)}, follow_redirects=False
        )
        assert r.status_code == 303
    [record] = [s for s in durably.Client(sqlite_url).signals("w") if s["name"] == api.CANCELLED_BY]
    assert '"carol"' in record["payload"]


def test_tokens_from_a_file_and_bad_token_files(tmp_path: Any) -> None:
    path = tmp_path / "tokens"
    path.write_text("# ops\nalice:aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbb\n")
    tokens = auth.load_tokens(str(path), {})
    assert [(t.name, t.secret) for t in tokens] == [
        ("alice", "aaaaaaaaaaaaaaaaaaaa"),
        (None, "bbbbbbbbbbbbbbbbbbbb"),
    ]
    path.write_text("short\n")
    with pytest.raises(durably.DurablyError, match=r"tokens line 1: .*at least 16"):
        auth.load_tokens(str(path), {})
    with pytest.raises(durably.DurablyError, match="cannot read token file"):
        auth.load_tokens(str(tmp_path / "missing"), {})
    assert auth.load_tokens(None, {"DURABLY_API_TOKEN": "x" * 20})[0].secret == "x" * 20
    assert auth.load_tokens(None, {}) == []


def test_serving_off_loopback_without_a_token_refuses_to_start(sqlite_url: str) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "DURABLY_API_TOKEN"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "durably.cli",
            "--database",
            sqlite_url,
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(harness.free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    assert "not a loopback address" in done.stderr and "DURABLY_API_TOKEN" in done.stderr
    assert done.stdout == ""  # errors go to stderr
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("::1")
    assert auth.is_loopback("localhost") and not auth.is_loopback("0.0.0.0")


def test_a_real_server_answers_with_the_token_and_refuses_without(sqlite_url: str) -> None:
    import httpx

    durably.Client(sqlite_url).start("srv-wait", workflow_id="w")
    with harness.server(sqlite_url) as base:
        assert httpx.get(base + "/api/workflows/w").status_code == 401
        r = httpx.get(base + "/api/workflows/w", headers=BEARER)
        assert r.status_code == 200 and r.json()["status"] == "pending"


# --- the document ----------------------------------------------------------------------------


def test_openapi_lists_every_api_route_and_only_those(sqlite_url: str) -> None:
    with make(sqlite_url) as c:
        doc = c.get("/openapi.json").json()
        served = {
            (method, r.path)
            for r in c.app.routes  # type: ignore[attr-defined]
            if getattr(r, "path", "").startswith("/api/")
            for method in (r.methods or set()) - {"HEAD"}
        }
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == served
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "401" in op["responses"]
            named = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            assert named == set(re.findall(r"{(\w+)}", path))


# --- reading ---------------------------------------------------------------------------------


def test_list_filters_and_pages_without_repeating_a_row(http: TestClient, store_url: str) -> None:
    client = durably.Client(store_url)
    queue = durably.Queue("srv-q")
    ids = []
    for i in range(5):
        ids.append(client.start("srv-wait", workflow_id=f"a{i}"))
    queued = queue.enqueue_sync(client, "srv-other", workflow_id="q1")
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "name": "srv-wait"}
        if cursor:
            params["cursor"] = cursor
        r = http.get("/api/workflows", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["workflows"]) <= 2
        seen += [w["workflow_id"] for w in page["workflows"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    r = http.get("/api/workflows", params={"queue": "srv-q"})
    assert [w["workflow_id"] for w in r.json()["workflows"]] == [queued]
    created = client.get_workflow("a2").created_at
    r = http.get("/api/workflows", params={"created_after": created, "name": "srv-wait"})
    after = {w["workflow_id"] for w in r.json()["workflows"]}
    r = http.get("/api/workflows", params={"created_before": created, "name": "srv-wait"})
    before = {w["workflow_id"] for w in r.json()["workflows"]}
    assert "a2" in after and "a2" not in before and after | before == set(ids)
    assert http.get("/api/workflows", params={"status": "pending"}).json()["workflows"]
    assert http.get("/api/workflows", params={"status": "failed"}).json()["workflows"] == []
    summary = http.get("/api/summary").json()
    assert summary["counts"]["pending"] == 6 and summary["total"] == 6
    seen, cursor = [], None
    while True:  # oldest first, a page at a time, by id prefix
        params = {
            "limit": 2,
            "id_prefix": "a",
            "order": "asc",
            **({"cursor": cursor} if cursor else {}),
        }
        page = http.get("/api/workflows", params=params).json()
        seen += [w["workflow_id"] for w in page["workflows"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == ids
    assert http.get("/api/workflows", params={"parent_id": "a1"}).json()["workflows"] == []


@pytest.mark.parametrize(
    "params, names",
    [
        ({"status": "bogus"}, "bogus"),
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"cursor": "!!!"}, "cursor"),
        ({"order": "up"}, "order"),
    ],
)
def test_bad_list_parameters_are_422_naming_the_parameter(
    sqlite_http: TestClient, params: dict[str, str], names: str
) -> None:
    r = sqlite_http.get("/api/workflows", params=params)
    assert r.status_code == 422 and names in r.json()["error"]["message"]


def test_get_history_and_signal(http: TestClient, store_url: str) -> None:
    assert http.get("/api/workflows/nope").status_code == 404
    assert http.get("/api/workflows/nope/history").status_code == 404
    assert http.post("/api/workflows/nope/signals", json={"name": "go"}).status_code == 404
    r = http.post("/api/workflows", json={"workflow": "srv-wait", "workflow_id": "w"})
    assert r.status_code == 201 and r.json()["status"] == "pending"
    with harness.engine_thread(store_url):
        harness.until(
            lambda: http.get("/api/workflows/w").json()["status"] == "waiting",
            "the workflow to wait for its signal",
        )
        r = http.post(
            "/api/workflows/w/signals",
            json={"name": "go", "payload": {"n": 1}, "idempotency_key": "k"},
        )
        assert r.status_code == 200 and r.json()["sent"] is True
        again = http.post(
            "/api/workflows/w/signals",
            json={"name": "go", "payload": {"n": 1}, "idempotency_key": "k"},
        )
        assert again.json()["sent"] is False
        harness.until(
            lambda: http.get("/api/workflows/w").json()["status"] == "completed",
            "the workflow to complete",
        )
    info = http.get("/api/workflows/w").json()
    assert info["output"] == {"n": 1}
    hist = http.get("/api/workflows/w/history").json()
    assert [e["kind"] for e in hist["entries"]] == ["signal"]
    assert hist["timeline"][0]["label"] == "signal() go" and hist["signals"][0]["consumed_seq"] == 1
    assert hist["claims"][0]["reason"] == "start"


@pytest.mark.parametrize(
    "body, status",
    [
        ({}, 422),
        ({"workflow": ""}, 422),
        ({"workflow": "x", "args": {}}, 422),
        ({"workflow": "x", "kwargs": []}, 422),
        ({"workflow": "x", "args": [{"$bad": 1}]}, 201),
    ],
)
def test_start_validates_its_body(sqlite_http: TestClient, body: Any, status: int) -> None:
    r = sqlite_http.post("/api/workflows", json=body)
    assert r.status_code == status, r.text


def test_a_body_that_is_not_a_json_object_is_422(sqlite_http: TestClient) -> None:
    for content in (b"[1]", b"{nope"):
        r = sqlite_http.post("/api/workflows", content=content)
        assert r.status_code == 422, r.text


def test_start_on_a_taken_id_of_another_workflow_is_409(sqlite_http: TestClient) -> None:
    assert sqlite_http.post("/api/workflows", json={"workflow": "a", "workflow_id": "x"}).is_success
    r = sqlite_http.post("/api/workflows", json={"workflow": "b", "workflow_id": "x"})
    assert r.status_code == 409 and r.json()["error"]["type"] == "WorkflowIdConflict"


def test_cancel_records_who_resume_and_fork(http: TestClient, store_url: str) -> None:
    assert http.post("/api/workflows/nope/cancel").status_code == 404
    assert http.post("/api/workflows/nope/resume").status_code == 404
    http.post("/api/workflows", json={"workflow": "srv-wait", "workflow_id": "w"})
    with harness.engine_thread(store_url):
        harness.until(
            lambda: http.get("/api/workflows/w").json()["status"] == "waiting",
            "the workflow to wait",
        )
        assert http.post("/api/workflows/w/resume").status_code == 409  # not stopped
        r = http.post("/api/workflows/w/cancel", json={})
        assert r.status_code == 200 and r.json() == {
            "workflow_id": "w",
            "cancelled": ["w"],
            "by": "alice",
        }
        harness.until(
            lambda: http.get("/api/workflows/w").json()["status"] == "cancelled",
            "the workflow to be cancelled",
        )
        r = http.post("/api/workflows/w/fork", json={"from_seq": 0, "new_id": "w2"})
        assert r.status_code == 201 and r.json()["workflow_id"] == "w2"
        assert http.post("/api/workflows/w/fork", json={"from_seq": "x"}).status_code == 422
        r = http.post("/api/workflows/w/resume")
        # the row as read after the resume: pending, unless the engine beside it has
        # claimed it already (and maybe run it to its wait again), as it may on PostgreSQL
        assert r.status_code == 200 and r.json()["status"] in ("pending", "running", "waiting")
        harness.until(
            lambda: http.get("/api/workflows/w").json()["status"] == "waiting",
            "the resumed workflow to wait again",
        )
    signals = http.get("/api/workflows/w/history").json()["signals"]
    [record] = [s for s in signals if s["name"] == api.CANCELLED_BY]
    assert record["payload"]["by"] == "alice"


def test_an_unnamed_token_records_the_by_field_or_api(store_url: str) -> None:
    for wid in ("w", "w2", "w3"):  # a cancel of a pending workflow is final: one each
        durably.Client(store_url).start("srv-wait", workflow_id=wid)
    with make(store_url, harness.SECRET) as c:
        c.headers.update(BEARER)
        assert c.post("/api/workflows/w/cancel", json={"by": "dave"}).json()["by"] == "dave"
        assert c.post("/api/workflows/w2/cancel").json()["by"] == "api"
        assert c.post("/api/workflows/w3/cancel", json={"by": 3}).status_code == 422


def test_a_second_cancel_of_a_workflow_the_first_ended_asks_nothing(store_url: str) -> None:
    durably.Client(store_url).start("srv-wait", workflow_id="w")  # pending: cancelled at once
    with make(store_url, harness.SECRET) as c:
        c.headers.update(BEARER)
        assert c.post("/api/workflows/w/cancel").json()["cancelled"] == ["w"]
        again = c.post("/api/workflows/w/cancel")
        assert (again.status_code, again.json()["cancelled"]) == (200, [])
    assert durably.Client(store_url).get_workflow("w").status == "cancelled"


# --- decisions -------------------------------------------------------------------------------


def _pending(http: TestClient) -> list[dict[str, Any]]:
    approvals: list[dict[str, Any]] = http.get("/api/approvals").json()["approvals"]
    return approvals


def test_approve_once_bound_to_the_arguments_shown(http: TestClient, store_url: str) -> None:
    http.post(
        "/api/workflows", json={"workflow": "srv-refund", "args": ["A1", 5000], "workflow_id": "r"}
    )
    with harness.engine_thread(store_url):
        [pending] = harness.until(lambda: _pending(http), "an approval to be pending")
        assert pending["tool"] == "refund" and pending["arguments"] == {
            "order_id": "A1",
            "cents": 5000,
        }
        assert http.get("/api/approvals", params={"workflow_id": "r"}).json()["approvals"]
        assert http.post("/api/workflows/r/approve", json={}).status_code == 422  # no expect
        r = http.post("/api/workflows/r/approve", json={"expect": "0" * 64})
        assert r.status_code == 409 and r.json()["error"]["type"] == "ApprovalStale"
        assert http.post("/api/workflows/nope/approve", json={"expect": "x"}).status_code == 404
        r = http.post("/api/workflows/r/approve", json={"expect": pending["args_sha256"]})
        assert r.status_code == 200 and r.json()["by"] == "alice"
        again = http.post("/api/workflows/r/approve", json={"expect": pending["args_sha256"]})
        assert again.status_code == 409
        harness.until(
            lambda: http.get("/api/workflows/r").json()["status"] == "completed",
            "the refund to complete",
        )
    assert http.get("/api/workflows/r").json()["output"] == {"refund_id": "re_A1", "cents": 5000}
    [decision] = [s for s in http.get("/api/workflows/r/history").json()["signals"]]
    assert decision["payload"]["by"] == "alice" and decision["payload"]["decision"] == "approve"


def test_reject_tells_the_workflow_who_and_why(http: TestClient, store_url: str) -> None:
    http.post(
        "/api/workflows", json={"workflow": "srv-refund", "args": ["A2", 1], "workflow_id": "r"}
    )
    with harness.engine_thread(store_url):
        [pending] = harness.until(lambda: _pending(http), "an approval to be pending")
        r = http.post(
            "/api/workflows/r/reject", json={"expect": pending["args_sha256"], "reason": "too much"}
        )
        assert r.status_code == 200 and r.json()["decision"] == "reject"
        harness.until(
            lambda: http.get("/api/workflows/r").json()["status"] == "completed",
            "the workflow to end",
        )
    output = http.get("/api/workflows/r").json()["output"]
    assert output["by"] == "alice" and "too much" in output["rejected"]


def test_resolve_a_review_once_and_record_who(http: TestClient, store_url: str) -> None:
    harness.park_for_review(store_url, "t")
    with harness.engine_thread(store_url):
        [item] = harness.until(
            lambda: http.get("/api/reviews").json()["reviews"], "the transfer's review to open"
        )
        # Listed from the moment its run opens it; decided only once the run has parked.
        harness.until(
            lambda: http.get("/api/workflows/t").json()["status"] == "needs_review",
            "the transfer to park for review",
        )
        assert (item["workflow_id"], item["seq"], item["step"]) == ("t", 1, "transfer")
        assert http.post("/api/workflows/t/reviews/1/resolve", json={}).status_code == 422
        assert (
            http.post(
                "/api/workflows/t/reviews/1/resolve", json={"retry": True, "fail": "x"}
            ).status_code
            == 422
        )
        assert (
            http.post("/api/workflows/t/reviews/x/resolve", json={"retry": True}).status_code == 422
        )
        assert (
            http.post("/api/workflows/t/reviews/9/resolve", json={"retry": True}).status_code == 409
        )
        r = http.post("/api/workflows/t/reviews/1/resolve", json={"result": {"transfer_id": "T"}})
        assert r.status_code == 200 and r.json()["decided_by"] == "alice", r.text
        again = http.post("/api/workflows/t/reviews/1/resolve", json={"retry": True})
        assert again.status_code == 409 and again.json()["error"]["type"] == "AlreadyResolved"
        harness.until(
            lambda: http.get("/api/workflows/t").json()["status"] == "completed",
            "the transfer workflow to complete",
        )
    assert http.get("/api/workflows/t").json()["output"] == {"transfer_id": "T"}
    assert flows.RAN == ["ORD-1"]  # decided as happened: not run again


def test_workers_lists_a_running_engine(http: TestClient, store_url: str) -> None:
    assert http.get("/api/workers").json() == {"workers": []}
    with harness.engine_thread(store_url):
        [w] = http.get("/api/workers").json()["workers"]
        assert w["pid"] > 0 and w["heartbeat_age"] >= 0


def test_poll_version_changes_when_the_workflow_does(
    sqlite_http: TestClient, sqlite_url: str
) -> None:
    sqlite_http.post("/api/workflows", json={"workflow": "srv-wait", "workflow_id": "w"})
    first = sqlite_http.get("/api/poll", params={"workflow_id": "w"}).json()["version"]
    assert sqlite_http.get("/api/poll", params={"workflow_id": "w"}).json()["version"] == first
    sqlite_http.post("/api/workflows/w/signals", json={"name": "go"})
    assert sqlite_http.get("/api/poll", params={"workflow_id": "w"}).json()["version"] != first
    assert sqlite_http.get("/api/poll", params={"workflow_id": "nope"}).status_code == 404


def test_dashboard_pages_render_and_escape_user_text(sqlite_url: str) -> None:
    client = durably.Client(sqlite_url)
    client.start("<b>evil</b>", "<script>alert(1)</script>", workflow_id="x")
    with make(sqlite_url) as c:
        assert c.get("/", follow_redirects=False).status_code == 303
        harness.login(c)
        for page in (
            "/",
            "/approvals",
            "/reviews",
            "/workers",
            "/workflows/x",
            "/workflows/nope",
            "/?status=pending",
            "/?cursor=bad",
        ):
            r = c.get(page)
            assert r.status_code == 200, page
            assert "<script>alert" not in r.text and "<b>evil" not in r.text, page
        assert "&lt;b&gt;evil&lt;/b&gt;" in c.get("/").text
        partial = c.get("/workflows/x", headers={"X-Partial": "1"}).text
        assert "<html" not in partial and "Timeline" in partial


def test_login_redirects_only_to_paths_on_this_server(sqlite_url: str) -> None:
    with make(sqlite_url) as c:
        for target, expected in (
            ("/reviews", "/reviews"),
            ("//evil.example/", "/"),
            ("https://evil.example/", "/"),
        ):
            r = harness.login(c, next=target)
            assert r.headers["location"] == expected


def test_responses_forbid_framing_and_foreign_scripts(sqlite_http: TestClient) -> None:
    for path in ("/login", "/api/summary", "/static/style.css"):
        r = sqlite_http.get(path)
        assert r.headers["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path


def test_the_timeline_marks_the_gap_replays_and_model_usage() -> None:
    from durably import journal
    from durably.server import views

    response = (
        '{"model": "gpt-4.1", "usage": {"prompt_tokens": 1000, "completion_tokens": 500},'
        ' "choices": []}'
    )
    entries = [
        journal.Entry(1, "step", "llm:chat", "completed", 1, response, 10.0, 11.0),
        journal.Entry(2, "now", "", "completed", 1, "1.0", 11.0, 11.0),
        journal.Entry(3, "step", "charge", "completed", 2, '{"id": 1}', 30.0, 30.5),
    ]
    claims = [
        journal.Claim("w", 1, "a", 9.0, None, "start"),
        journal.Claim("w", 2, "b", 25.0, "a", "recovery"),
    ]
    rows = views.timeline(entries, claims)
    assert [r.get("seq", "gap") for r in rows] == [1, 2, "gap", 3]
    first, now, gap, charge = rows
    assert first["tokens"] == 1500 and first["cost"] == pytest.approx(0.006)
    assert first["replayed"] and now["replayed"] and not charge["replayed"]
    assert now["duration"] is None and charge["duration"] == pytest.approx(0.5)
    assert gap["seconds"] == pytest.approx(14.0) and gap["owner"] == "b"
    assert charge["attempt"] == 2 and charge["label"] == "charge"
    assert "1 model call" in (views.usage_line(entries, claims) or "")


# --- fuzzing: no input makes a route answer 5xx ------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = [
    "workflow",
    "args",
    "kwargs",
    "workflow_id",
    "name",
    "payload",
    "idempotency_key",
    "from_seq",
    "new_id",
    "expect",
    "tool_call_id",
    "note",
    "reason",
    "result",
    "retry",
    "fail",
    "by",
]
_BODIES = st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4) | _JSON
_QUERY = st.dictionaries(
    st.sampled_from(
        [
            "status",
            "name",
            "queue",
            "created_after",
            "created_before",
            "cursor",
            "limit",
            "workflow_id",
        ]
    ),
    st.text(max_size=12),
    max_size=3,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    route=st.sampled_from(api.schema_routes()),
    wid=st.sampled_from(["w", "nope", "ü%20x"]),
    seq=st.sampled_from(["1", "0", "-1", "99999999999999999999"]),
    body=_BODIES,
    query=_QUERY,
)
def test_no_input_makes_a_route_answer_5xx(
    sqlite_http: TestClient,
    route: tuple[str, str],
    wid: str,
    seq: str,
    body: Any,
    query: dict[str, str],
) -> None:
    method, path = route
    sqlite_http.post("/api/workflows", json={"workflow": "srv-wait", "workflow_id": "w"})
    url = path.replace("{workflow_id}", wid).replace("{seq}", seq)
    if path == "/api/events":
        query = {**query, "seconds": "0"}  # a stream that ends after its first event
    r = sqlite_http.request(method, url, params=query, json=body)
    assert r.status_code < 500, (method, url, query, body, r.text)
    if r.headers["content-type"].startswith("text/event-stream"):
        assert r.is_success and r.text.startswith("retry:"), r.text
    else:
        assert "error" in r.json() or r.is_success


def test_pages_show_values_readably_and_mark_bookkeeping_rows(sqlite_url: str) -> None:
    """A newcomer reads times, not codec tags; engine bookkeeping rows are marked quiet."""
    client = durably.Client(sqlite_url)
    client.start("srv-refund", "A1", 12_000, workflow_id="r")
    with harness.engine_thread(sqlite_url):
        harness.until(lambda: client.list_approvals("r"), "the refund approval")
    with make(sqlite_url) as c:
        harness.login(c)
        page = c.get("/workflows/r").text
        timeline = c.get("/api/workflows/r/history", headers=BEARER).json()["timeline"]
        listing = c.get("/").text
    now_row = next(r for r in timeline if r["kind"] == "now")
    assert "__durably__" not in now_row["preview"] and now_row["preview"].startswith("20")
    assert now_row["quiet"] is True
    assert next(r for r in timeline if r["kind"] == "signal")["quiet"] is False
    assert "__durably__" not in page
    assert 'class="st-completed quiet"' in page
    assert re.search(r"asked \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page), "a readable time"
    assert "<th>queue</th>" not in listing  # no workflow has a queue: no empty column


def test_a_query_value_no_database_can_hold_is_a_documented_422(sqlite_http: TestClient) -> None:
    """A NUL in a query parameter is refused with 422, and every route that reads a query
    documents 422 (schemathesis generated ``GET /api/reviews?workflow_id=a%00b``)."""
    doc = sqlite_http.get("/openapi.json").json()
    for route in ("/api/reviews", "/api/approvals"):
        r = sqlite_http.get(route, params={"workflow_id": "a\x00b"})
        assert r.status_code == 422, (route, r.text)
        assert "NUL" in r.json()["error"]["message"]
        assert "422" in doc["paths"][route]["get"]["responses"], route
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if operation.get("parameters") and any(
                p["in"] == "query" for p in operation["parameters"]
            ):
                assert "422" in operation["responses"], (method, path)
