"""The dashboard's list filters (those list_workflows has: status, name, id prefix, queue,
parent) and a fork's ``forked_from`` on its workflow page, on SQLite and PostgreSQL.

Real workflows run by a real engine, read through the real app; the browser test of
the same is in tests/test_server_browser.py.
"""

from __future__ import annotations

import asyncio
import re

from starlette.testclient import TestClient

import durably
from durably.queues import Queue
from durably.server import app, auth
from tests.serverkit import flows, harness


def family(url: str) -> None:
    """order-P1 (a parent, completed) with its child order-P1-child; other-Q1 on a queue
    (pending, delayed an hour; nothing serves it); order-P1-fork, a fork of order-P1 after
    its first entry."""

    async def main() -> None:
        async with durably.Engine(url, poll_interval=0.05) as engine:
            parent = await engine.start(flows.parent_flow, "order-P1", workflow_id="order-P1")
            await parent.result(timeout=20)

    asyncio.run(main())
    with durably.Client(url) as client:
        Queue("srv-filter-queue").enqueue_sync(
            client, "srv-wait", workflow_id="other-Q1", delay=3600
        )
        client.fork("order-P1", 1, "order-P1-fork")


def ids_listed(page: str) -> list[str]:
    return re.findall(r'<a class="mono" href="/workflows/[^"]+">([^<]+)</a>', page)


def test_the_list_page_filters_and_the_workflow_page_shows_the_fork(store_url: str) -> None:
    family(store_url)
    with TestClient(app.create_app(store_url, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        harness.login(c)
        assert sorted(ids_listed(c.get("/").text)) == [
            "order-P1", "order-P1-child", "order-P1-fork", "other-Q1",
        ]  # fmt: skip
        cases = {
            "/?id_prefix=order-P1-": ["order-P1-child", "order-P1-fork"],
            "/?parent=order-P1": ["order-P1-child"],
            "/?queue=srv-filter-queue": ["other-Q1"],
            "/?status=completed&id_prefix=order": ["order-P1", "order-P1-child"],
            "/?name=srv-parent": ["order-P1", "order-P1-fork"],
            "/?parent=nobody": [],
        }
        for url, expected in cases.items():
            page = c.get(url).text
            assert sorted(ids_listed(page)) == expected, url
        # the form keeps what was typed, so the next filter adds to it
        page = c.get("/?id_prefix=order-&parent=order-P1").text
        assert 'name="id_prefix" value="order-"' in page
        assert 'name="parent" value="order-P1"' in page
        assert "match these filters" in c.get("/?parent=nobody").text

        fork = c.get("/workflows/order-P1-fork").text
        forked = re.search(r'<span class="forked">(.*?)</span>', fork, re.S)
        assert forked is not None
        assert 'href="/workflows/order-P1"' in forked.group(1)
        assert "at seq 1" in forked.group(1)
        assert 'class="forked"' not in c.get("/workflows/order-P1").text
        child = c.get("/workflows/order-P1-child").text
        assert 'class="mono parent" href="/workflows/order-P1"' in child
        assert "starts after" not in child
        delayed = c.get("/workflows/other-Q1").text
        assert re.search(r"starts after \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", delayed)
