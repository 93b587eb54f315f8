"""Counts by status that stop at a cap: what the dashboard shows (``10000+``) and its
stream reads again, in a read that does not grow with history past the cap. Through the
store, the Client, the JSON API and the list page, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durably
from durably.server import api, app, auth
from durably.storage import create_store
from tests.serverkit import harness


def _fill(url: str, counts: dict[str, int]) -> None:
    """Workflows of each status, committed."""
    store: Any = create_store(url)
    store.open()
    try:
        store._begin(True)
        n = 0
        for status, count in counts.items():
            for _ in range(count):
                n += 1
                sql_text = (
                    "INSERT INTO workflows (workflow_id, name, status, input, created_at, "
                    f"updated_at) VALUES ('w-{n}', 'n', :status, '[]', {n}, {n})"
                )
                store._execute(store._paramstyle(sql_text), {"status": status})
        store._commit()
    finally:
        store.close()


COUNTS = {"completed": 7, "failed": 3, "pending": 5, "waiting": 1}


@pytest.fixture
def filled(store_url: str) -> str:
    _fill(store_url, COUNTS)
    return store_url


def test_a_capped_count_is_exact_below_the_cap_and_the_cap_above_it(filled: str) -> None:
    with durably.Client(filled) as client:
        assert client.count_by_status() == COUNTS
        assert client.count_by_status(cap=100) == COUNTS
        assert client.count_by_status(cap=5) == {
            "completed": 5,
            "failed": 3,
            "pending": 5,
            "waiting": 1,
        }
        assert client.count_by_status(cap=1) == dict.fromkeys(COUNTS, 1)


@pytest.mark.parametrize("cap", [0, -3, True, 2.5, "10", 2**63])
def test_a_cap_that_is_not_a_count_is_refused(sqlite_url: str, cap: Any) -> None:
    with durably.Client(sqlite_url) as client, pytest.raises(ValueError, match="cap"):
        client.count_by_status(cap=cap)


def test_a_capped_count_reads_the_cap_not_the_history(sqlite_url: str) -> None:
    """Over 20,000 completed workflows: the exact count runs an instruction budget per
    workflow (SQLite's progress handler counts them); the capped one a few per cap."""
    store: Any = create_store(sqlite_url)
    store.open()
    try:
        store._begin(True)
        store._execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at)"
            " SELECT 'done-' || i, 'n', 'completed', '[]', i, i FROM n"
        )
        store._commit()
        work = {}
        for label, cap in (("exact", None), ("capped", 100)):
            steps = [0]

            def count(steps: list[int] = steps) -> int:
                steps[0] += 1
                return 0

            store._conn.set_progress_handler(count, 100)
            try:
                found = store.count_by_status(cap)
            finally:
                store._conn.set_progress_handler(None, 0)
            work[label] = steps[0]
            assert found == {"completed": 20_000 if cap is None else 100}
        assert work["exact"] > 20 * work["capped"], work
    finally:
        store.close()


@pytest.fixture
def http(filled: str) -> Iterator[TestClient]:
    with TestClient(app.create_app(filled, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        c.headers.update({"Authorization": f"Bearer {harness.SECRET}"})
        yield c


def test_the_summary_counts_up_to_a_cap_and_names_the_statuses_at_it(http: TestClient) -> None:
    exact = http.get("/api/summary").json()
    assert exact["total"] == 16 and exact["capped"] == []
    assert exact["counts"]["completed"] == 7 and exact["counts"]["diverged"] == 0
    capped = http.get("/api/summary", params={"cap": 5}).json()
    assert capped["counts"]["completed"] == 5 and capped["counts"]["failed"] == 3
    assert capped["capped"] == ["pending", "completed"] and capped["total"] == 14
    for bad in ("0", "-1", "x", "1.5"):
        r = http.get("/api/summary", params={"cap": bad})
        assert r.status_code == 422, (bad, r.text)
        assert "cap" in r.json()["error"]["message"]


def test_the_list_page_shows_a_count_at_the_cap_with_a_plus(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def shown(page: str) -> dict[str, str]:
        link = r'<a class="count[^"]*" href="/(?:\?status=(\w+))?"><b>([^<]+)</b>'
        found = re.findall(link, page)
        return {status or "all": n for status, n in found}

    harness.login(http, next="/")
    counts = shown(http.get("/").text)
    assert counts["all"] == "16" and counts["completed"] == "7" and counts["failed"] == "3"
    monkeypatch.setattr(api, "COUNT_CAP", 5)
    counts = shown(http.get("/").text)
    assert counts["completed"] == "5+" and counts["pending"] == "5+"
    assert counts["failed"] == "3" and counts["waiting"] == "1" and counts["cancelled"] == "0"
    assert counts["all"] == "14+"
