"""Live updates by server-sent events: /api/events over a real ``durably serve``.

A stream sends a ``version`` event at once and another when what a page shows
changes; it is authenticated like every route, and its workflow must exist.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx

import durably
from tests.serverkit import harness

BEARER = {"Authorization": f"Bearer {harness.SECRET}"}


def _versions(response: httpx.Response) -> Iterator[str]:
    """The version of each ``version`` event, as the stream delivers them."""
    event = ""
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line.partition(":")[2].strip()
        elif line.startswith("data:") and event == "version":
            yield json.loads(line.partition(":")[2])["version"]


def test_events_push_a_new_version_when_the_workflow_changes(store_url: str) -> None:
    client = durably.Client(store_url)
    client.start("srv-wait", workflow_id="w")
    with harness.server(store_url) as base:
        params = {"workflow_id": "w", "seconds": "60"}
        with httpx.stream(
            "GET", base + "/api/events", params=params, headers=BEARER, timeout=30
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            versions = _versions(r)
            first = next(versions)
            assert (
                first
                == httpx.get(
                    base + "/api/poll", params={"workflow_id": "w"}, headers=BEARER
                ).json()["version"]
            )
            sent = time.monotonic()
            client.send_signal("w", "go", {"n": 1})
            second = next(versions)  # blocks until the server pushes (read timeout 30 s)
            assert second != first
            assert time.monotonic() - sent < 10


def test_the_list_pages_stream_shows_a_finish_at_once_and_a_delete_within_ten_seconds(
    sqlite_url: str,
) -> None:
    """The list page's stream reads the unfinished workflows' counts at every look and
    the finished ones every EVENTS_FINISHED_EVERY seconds (they grow with history): a
    cancel shows at once, the delete of a finished workflow alone within that."""
    from durably.server.api import EVENTS_FINISHED_EVERY, EVENTS_INTERVAL

    client = durably.Client(sqlite_url)
    client.start("srv-wait", workflow_id="old")
    client.cancel("old")
    client.start("srv-wait", workflow_id="w")  # the newest: a delete of "old" leaves it so
    with (
        harness.server(sqlite_url) as base,
        httpx.stream(
            "GET", base + "/api/events", params={"seconds": "60"}, headers=BEARER, timeout=30
        ) as r,
    ):
        versions = _versions(r)
        first = next(versions)
        time.sleep(2 * EVENTS_INTERVAL + 0.5)  # past the stream's first looks
        sent = time.monotonic()
        client.cancel("w")
        second = next(versions)
        assert second != first and time.monotonic() - sent < 5
        sent = time.monotonic()
        assert client.delete("old") == ["old"]
        third = next(versions)
        took = time.monotonic() - sent
        assert third != second and took < EVENTS_FINISHED_EVERY + 5, took
        poll = httpx.get(base + "/api/poll", headers=BEARER).json()["version"]
        assert third == poll  # the stream's version is the poll's, read anew


def test_events_are_refused_without_a_token_and_for_an_unknown_workflow(sqlite_url: str) -> None:
    with harness.server(sqlite_url) as base:
        r = httpx.get(base + "/api/events", params={"seconds": "0"}, timeout=10)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "Unauthorized"
        r = httpx.get(
            base + "/api/events",
            params={"seconds": "0"},
            headers={"Authorization": "Bearer wrong-token-0123456789"},
            timeout=10,
        )
        assert r.status_code == 401
        r = httpx.get(
            base + "/api/events", params={"workflow_id": "nope"}, headers=BEARER, timeout=10
        )
        assert r.status_code == 404
        r = httpx.get(base + "/api/events", params={"seconds": "-1"}, headers=BEARER, timeout=10)
        assert r.status_code == 422 and "seconds" in r.json()["error"]["message"]
        r = httpx.get(base + "/api/events", params={"seconds": "0"}, headers=BEARER, timeout=10)
        assert r.status_code == 200 and r.text.count("event: version") == 1


def test_serve_stops_promptly_on_sigint_with_an_event_stream_open(sqlite_url: str) -> None:
    """An open dashboard (its event stream) does not hold ``durably serve`` up on Ctrl-C."""
    import signal
    import sys
    import threading

    port = harness.free_port()
    args = [sys.executable, "-m", "durably.cli", "--database", sqlite_url, "serve"]
    with harness.process(
        [*args, "--port", str(port)], {"DURABLY_API_TOKEN": harness.TOKEN}
    ) as proc:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(base + "/openapi.json", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        harness.until(up, "durably serve to answer", 30)
        opened = threading.Event()

        def listen() -> None:
            try:
                with httpx.stream("GET", base + "/api/events", headers=BEARER, timeout=60) as r:
                    for _ in r.iter_lines():
                        opened.set()
            except httpx.HTTPError:
                pass  # the server went away: what this test wants

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        assert opened.wait(20), "the event stream did not open"
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        proc.wait(30)
        assert time.monotonic() - sent < 10, "serve waited for the open stream to end"
        listener.join(10)
