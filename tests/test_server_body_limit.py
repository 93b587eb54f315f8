"""The request body limit of ``durably serve``: a body over it is a 413, never read whole.

A body that declares its length (``Content-Length``) over the limit is refused before
any of it is read; a chunked body, which declares nothing, is counted as it arrives
and refused as soon as the count passes the limit. The API answers with its JSON
error, the dashboard's forms with a plain message.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

import durably
from durably.server import app, auth
from tests.serverkit import harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}
MiB = 1024 * 1024


def _small(url: str, limit: int) -> TestClient:
    """A test client of an app whose body limit is ``limit`` bytes."""
    tokens = auth.parse_tokens(harness.TOKEN, "test")
    return TestClient(app.create_app(url, tokens, max_body_bytes=limit))


def _is_api_413(r: httpx.Response, limit: int) -> None:
    assert r.status_code == 413, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["type"] == "RequestTooLarge"
    assert f"{limit} bytes" in error["message"]


def _is_page_413(r: httpx.Response, limit: int) -> None:
    assert r.status_code == 413, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert f"{limit} bytes" in r.text


def test_the_default_limit_is_one_mib_and_a_body_over_it_is_a_413_that_starts_nothing(
    api_client: tuple[str, TestClient],
) -> None:
    """POST /api/workflows with a body one byte over 1 MiB: a JSON 413, no workflow."""
    url, http = api_client
    pad = "x" * MiB
    r = http.post("/api/workflows", json={"workflow": "srv-wait", "workflow_id": "big", "p": pad})
    _is_api_413(r, MiB)
    assert r.headers["x-content-type-options"] == "nosniff"  # the security headers still apply
    assert durably.Client(url).list_workflows() == []


def test_a_signal_over_the_limit_is_refused_and_one_at_the_limit_is_sent(
    sqlite_url: str,
) -> None:
    """The limit counts bytes of body: exactly ``limit`` passes, one more is a 413."""
    durably.Client(sqlite_url).start("srv-wait", workflow_id="w")
    limit = 4096
    with _small(sqlite_url, limit) as http:
        http.headers.update(BEARER)
        head = b'{"name": "go", "payload": "'
        tail = b'"}'
        fits = head + b"y" * (limit - len(head) - len(tail)) + tail
        assert len(fits) == limit
        r = http.post("/api/workflows/w/signals", content=fits)
        assert r.status_code == 200, r.text
        over = head + b"y" * (limit - len(head) - len(tail) + 1) + tail
        r = http.post("/api/workflows/w/signals", content=over)
        _is_api_413(r, limit)
    assert len(durably.Client(sqlite_url).signals("w")) == 1


def test_a_review_decision_over_the_limit_is_refused(sqlite_url: str) -> None:
    """The API's resolve and the dashboard's review form both refuse a body over the
    limit, and the review stays undecided."""
    harness.park_for_review(sqlite_url, "t")
    client = durably.Client(sqlite_url)
    with harness.engine_thread(sqlite_url):
        harness.until(
            lambda: client.get_workflow("t").status == "needs_review",
            "the transfer to park for review",
        )
    limit = 2048
    with _small(sqlite_url, limit) as http:
        harness.login(http)
        pad = "z" * limit
        r = http.post(
            "/workflows/t/reviews/1/resolve",
            data={"decision": "retry", "note": pad},
            follow_redirects=False,
        )
        _is_page_413(r, limit)
        r = http.post(
            "/api/workflows/t/reviews/1/resolve",
            json={"retry": True, "note": pad},
            headers=BEARER,
        )
        _is_api_413(r, limit)
    assert [r.seq for r in client.reviews()] == [1]
    assert client.get_workflow("t").status == "needs_review"


def test_a_login_form_over_the_limit_is_a_plain_413_that_logs_nobody_in(
    dashboard: tuple[str, TestClient],
) -> None:
    """The dashboard's login form: a plain 413, no session cookie, the token not echoed."""
    _, http = dashboard
    http.cookies.clear()
    r = http.post(
        "/login", data={"token": harness.SECRET, "name": "n" * MiB}, follow_redirects=False
    )
    _is_page_413(r, MiB)
    assert auth.COOKIE not in r.cookies
    assert harness.SECRET not in r.text


def test_a_limit_below_one_byte_is_a_config_error(sqlite_url: str) -> None:
    with pytest.raises(durably.errors.ServerConfigError, match="max_body_bytes"):
        app.create_app(sqlite_url, auth.parse_tokens(harness.TOKEN, "test"), max_body_bytes=0)


# --- a real server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the database, the base URL) of one real ``durably serve`` with the default limit."""
    url = f"sqlite:///{tmp_path_factory.mktemp('body-limit') / 'durably.db'}"
    with harness.server(url) as base:
        yield url, base


def _chunked_without_end(base: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """POST ``body`` chunked and never send the last chunk; what the server answers.

    A server that reads the whole body before answering waits for that last chunk,
    and this times out: only one that counts the chunks as they come can answer.
    """
    parts = urllib.parse.urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(head.encode())
        for at in range(0, len(body), 64 * 1024):
            chunk = body[at : at + 64 * 1024]
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        while data := s.recv(65536):  # the server closes the connection after its 413
            answer += data
    return answer


def _status_and_body(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(
        (k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])
    )
    return int(lines[0].split()[1]), headers, body


def test_a_chunked_api_body_over_the_limit_is_refused_while_it_streams(
    served: tuple[str, str],
) -> None:
    """A chunked body, no Content-Length: refused with the JSON 413 once past 1 MiB."""
    url, base = served
    body = b'{"workflow": "srv-wait", "workflow_id": "chunked", "p": "' + b"x" * MiB + b'"}'
    status, headers, payload = _status_and_body(
        _chunked_without_end(
            base, "/api/workflows", {**BEARER, "Content-Type": "application/json"}, body
        )
    )
    assert status == 413, payload
    assert headers["content-type"].startswith("application/json")
    assert headers["connection"] == "close"
    assert b'"RequestTooLarge"' in payload
    assert durably.Client(url).list_workflows() == []


def test_a_chunked_login_form_over_the_limit_is_a_plain_413(served: tuple[str, str]) -> None:
    _, base = served
    form = urllib.parse.urlencode({"token": harness.SECRET, "name": "n" * MiB}).encode()
    status, headers, payload = _status_and_body(
        _chunked_without_end(
            base, "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form
        )
    )
    assert status == 413, payload
    assert headers["content-type"].startswith("text/plain")
    assert "set-cookie" not in headers
    assert harness.SECRET.encode() not in payload


def test_a_chunked_body_under_the_limit_is_served(served: tuple[str, str]) -> None:
    """Counting does not get in the way: a whole chunked body under the limit starts one."""
    url, base = served

    def parts() -> Iterator[bytes]:
        yield b'{"workflow": "srv-wait", '
        yield b'"workflow_id": "small-chunked"}'

    r = httpx.post(base + "/api/workflows", content=parts(), headers=BEARER, timeout=10)
    assert r.status_code == 201, r.text
    assert [w.workflow_id for w in durably.Client(url).list_workflows()] == ["small-chunked"]


def test_serve_takes_the_limit_as_an_option(tmp_path: Path) -> None:
    """``durably serve --max-body-bytes N``: a declared length over N is a 413 up front."""
    url = f"sqlite:///{tmp_path}/durably.db"
    with harness.server(url, args=["--max-body-bytes", "1000"]) as base:
        r = httpx.post(base + "/api/workflows", content=b" " * 1001, headers=BEARER, timeout=10)
        _is_api_413(r, 1000)
        r = httpx.post(base + "/api/workflows", content=b" " * 1000, headers=BEARER, timeout=10)
        assert r.status_code == 422, r.text  # read: an empty object names no workflow


def test_the_openapi_document_declares_the_413(sqlite_url: str) -> None:
    """Every route that changes state may answer 413; reading ones take no body."""
    with _small(sqlite_url, 1000) as http:
        doc = http.get("/openapi.json").json()
    assert "413" in doc["paths"]["/api/workflows"]["post"]["responses"]
    assert "413" in doc["paths"]["/api/workflows/{workflow_id}/signals"]["post"]["responses"]
    assert "413" not in doc["paths"]["/api/workflows"]["get"]["responses"]


def test_serve_help_states_the_default_the_server_uses() -> None:
    """The command line cannot import the server to show its default: it says it in words."""
    from click.testing import CliRunner

    from durably.cli import main
    from durably.server import limits

    assert MiB == limits.DEFAULT_MAX_BODY_BYTES
    shown = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    assert f"default {limits.DEFAULT_MAX_BODY_BYTES}" in " ".join(shown.split())
