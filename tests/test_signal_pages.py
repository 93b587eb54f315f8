"""Pages of a workflow's signals (``signals_page``): what a chat-style agent's dashboard
page and the API read instead of every message its user sent.

On SQLite and PostgreSQL, through the real stores and the Client: paging back reads
every signal exactly once; the edges (no signals, a num past either end, an unknown
workflow, bad arguments) answer plainly; the dashboard shows the newest 50 signals,
their count and the way to the rest, beside the journal's pager, each keeping the
other's page; the API's paged history carries the newest signals and their count, its
whole answer is unchanged, and its signals route pages; one page of 20,000 signals
does a page's work, not the signals'.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durably
from durably import errors
from durably.server import journal_pages, signal_pages
from durably.storage import create_store
from tests import test_query_plans
from tests.test_history_pages import _crafted

BIGINT = 2**63 - 1


def _send(client: durably.Client, wid: str, n: int) -> None:
    """``n`` signals to ``wid``, their payloads "m1" .. "mN", in one transaction."""
    assert all(client.send_signals([(wid, "user-message", f"m{i}") for i in range(1, n + 1)]))


@pytest.fixture
def chat(store_url: str) -> Iterator[tuple[str, durably.Client]]:
    """A pending workflow "chat" sent 23 signals, one "quiet" sent none, and a Client."""
    with durably.Client(store_url) as client:
        client.start("chat-agent", workflow_id="chat")
        client.start("chat-agent", workflow_id="quiet")
        _send(client, "chat", 23)
        yield store_url, client


def _backwards(client: durably.Client, wid: str, limit: int) -> list[list[int]]:
    pages: list[list[int]] = []
    before: int | None = None
    while True:
        page = client.signals_page(wid, before_num=before, limit=limit)
        assert len(page) <= limit
        if not page:
            return pages
        pages.append([s["num"] for s in page])
        before = page[0]["num"]


def test_paging_back_reads_every_signal_exactly_once(chat: tuple[str, durably.Client]) -> None:
    _, client = chat
    whole = client.signals("chat")
    assert [s["payload"] for s in whole] == [f'"m{i}"' for i in range(1, 24)]
    for limit in (1, 2, 5, 22, 23, 24, 100):
        pages = _backwards(client, "chat", limit)
        nums = [n for page in reversed(pages) for n in page]
        assert nums == [s["num"] for s in whole], limit
        assert all(page == sorted(page) for page in pages)  # each page in num order
        assert len(pages[0]) == min(limit, 23)  # the newest first, full
    # the same dicts as signals(): a page is a slice of the whole
    assert client.signals_page("chat", limit=5) == whole[-5:]
    assert client.signals_page("chat", before_num=whole[3]["num"], limit=2) == whole[1:3]


def test_the_edges_and_bad_arguments(chat: tuple[str, durably.Client]) -> None:
    _, client = chat
    first = client.signals("chat")[0]["num"]
    assert client.signals_page("quiet", limit=5) == []
    assert client.signals_page("chat", before_num=first, limit=5) == []
    assert client.signals_page("chat", before_num=-(2**63), limit=5) == []
    assert len(client.signals_page("chat", before_num=BIGINT, limit=50)) == 23
    with pytest.raises(errors.WorkflowNotFound, match="no workflow with id 'nope'"):
        client.signals_page("nope", limit=5)
    for kwargs, says in [
        ({"limit": 0}, "limit=0"),
        ({"limit": True}, "limit=True"),
        ({"limit": 5, "before_num": "3"}, "before_num='3'"),
        ({"limit": 5, "before_num": 2**63}, "before_num="),
        ({"limit": 5, "before_num": 1.5}, "before_num=1.5"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            client.signals_page("chat", **kwargs)


# --- the dashboard --------------------------------------------------------------------------


def _signal_nums(html: str) -> list[int]:
    """The nums of the signals the page shows, in its order."""
    table = html.split("<h2>Signals</h2>", 1)[1].split("</section>", 1)[0]
    return [int(n) for n in re.findall(r'<tr><td class="num">(\d+)</td>', table)]


def _pagers(html: str) -> tuple[dict[str, str], dict[str, str] | None]:
    """The journal's first pager's links and the signals' pager's (None: no such pager)."""

    def links(pager: str) -> dict[str, str]:
        found = re.findall(r'<a href="([^"]+)">([^<]+)</a>', pager)
        return {re.sub("[^a-z]", "", w): href.replace("&amp;", "&") for href, w in found}

    journal, signals = html.split("<h2>Signals</h2>", 1)
    first = journal.split('<p class="pager">', 1)[1].split("</p>", 1)[0]
    section = signals.split("</section>", 1)[0]
    if '<p class="pager">' not in section:
        return links(first), None
    return links(first), links(section.split('<p class="pager">', 1)[1].split("</p>", 1)[0])


def _signal_line(html: str) -> str:
    section = html.split("<h2>Signals</h2>", 1)[1].split("</section>", 1)[0]
    found = re.search(r'<p class="pager"><span class="muted">([^<]*)</span>', section)
    assert found is not None
    return found.group(1)


def test_the_page_shows_the_newest_signals_their_count_and_the_way_to_the_rest(
    dashboard: tuple[str, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, c = dashboard
    _crafted(url)  # "g": twelve journal entries, a page of 4 below
    monkeypatch.setattr(journal_pages, "TIMELINE_PAGE", 4)
    with durably.Client(url) as client:
        _send(client, "g", 120)
        nums = [s["num"] for s in client.signals("g")]
    assert len(nums) == 120 and signal_pages.SIGNALS_PAGE == 50

    newest = c.get("/workflows/g")
    assert newest.status_code == 200
    assert _signal_nums(newest.text) == nums[-50:]
    assert _signal_line(newest.text) == f"50 of 120 signals (num {nums[70]} to {nums[-1]})"
    journal, signals = _pagers(newest.text)
    assert journal == {"oldest": "/workflows/g?after=0", "earlier": "/workflows/g?before=9"}
    assert signals == {"earlier": f"/workflows/g?signals_before={nums[70]}"}

    # the earlier signals, on the journal's page shown: each pager keeps the other's page
    middle = c.get(f"/workflows/g?before=9&signals_before={nums[70]}")
    assert _signal_nums(middle.text) == nums[20:70]
    assert "4 of 12 entries (seq 5 to 8)" in middle.text
    journal, signals = _pagers(middle.text)
    keep = f"signals_before={nums[70]}"
    assert journal == {
        "oldest": f"/workflows/g?after=0&{keep}",
        "earlier": f"/workflows/g?before=5&{keep}",
        "later": f"/workflows/g?after=8&{keep}",
        "newest": f"/workflows/g?{keep}",
    }
    assert signals == {
        "earlier": f"/workflows/g?before=9&signals_before={nums[20]}",
        "newest": "/workflows/g?before=9",
    }
    oldest = c.get(f"/workflows/g?after=4&signals_before={nums[20]}")
    assert _signal_nums(oldest.text) == nums[:20]
    assert _signal_line(oldest.text).startswith("20 of 120 signals")
    assert _pagers(oldest.text)[1] == {"newest": "/workflows/g?after=4"}
    past = c.get(f"/workflows/g?signals_before={nums[0]}")
    assert _signal_nums(past.text) == [] and _signal_line(past.text) == "no signals here, of 120"
    assert "No signals." not in past.text


def test_a_few_signals_are_shown_without_a_pager(
    dashboard: tuple[str, TestClient],
) -> None:
    url, c = dashboard
    with durably.Client(url) as client:
        client.start("chat-agent", workflow_id="few")
        client.start("chat-agent", workflow_id="none")
        _send(client, "few", 50)
    page = c.get("/workflows/few")
    assert page.status_code == 200 and len(_signal_nums(page.text)) == 50
    assert 'class="pager"' not in page.text
    assert "No signals." in c.get("/workflows/none").text


# --- the API ----------------------------------------------------------------------------------


@pytest.fixture
def chatty(api_client: tuple[str, TestClient]) -> TestClient:
    """The API's test client, with workflow "g" (a crafted journal) sent 70 signals."""
    url, c = api_client
    _crafted(url)
    with durably.Client(url) as client:
        _send(client, "g", 70)
    return c


def test_the_history_route_pages_the_signals_only_when_it_pages(chatty: TestClient) -> None:
    c = chatty
    whole = c.get("/api/workflows/g/history").json()
    assert "signals_count" not in whole and "page" not in whole  # as it always was
    assert [s["payload"] for s in whole["signals"]] == [f"m{i}" for i in range(1, 71)]
    for params in ({"limit": 5}, {"after_seq": 0}, {"before_seq": 9}):
        paged = c.get("/api/workflows/g/history", params=params).json()
        assert paged["signals_count"] == 70
        assert paged["signals"] == whole["signals"][-50:]


def test_the_signals_route_pages_through_every_signal(chatty: TestClient) -> None:
    c = chatty
    whole = c.get("/api/workflows/g/history").json()["signals"]
    newest = c.get("/api/workflows/g/signals").json()
    assert newest["count"] == 70 and newest["limit"] == signal_pages.SIGNALS_PAGE
    assert newest["signals"] == whole[-50:]
    assert newest["earlier_before_num"] == whole[20]["num"]
    seen: list[Any] = []
    params: dict[str, Any] = {"limit": 8}
    while True:
        page = c.get("/api/workflows/g/signals", params=params).json()
        assert len(page["signals"]) <= 8 and page["count"] == 70
        seen = page["signals"] + seen
        if page["earlier_before_num"] is None:
            break
        params = {"limit": 8, "before_num": page["earlier_before_num"]}
    assert seen == whole
    empty = c.get("/api/workflows/g/signals", params={"before_num": whole[0]["num"]}).json()
    assert empty == {"signals": [], "count": 70, "limit": 50, "earlier_before_num": None}
    assert c.get("/api/workflows/nobody/signals").status_code == 404


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"before_num": "1.5"}, "before_num"),
        ({"before_num": str(2**64)}, "before_num"),
        ({"before_num": str(-(2**64))}, "before_num"),
    ],
)
def test_the_signals_route_refuses_bad_paging_with_a_422(
    api_client: tuple[str, TestClient], params: dict[str, Any], says: str
) -> None:
    url, c = api_client
    _crafted(url)
    r = c.get("/api/workflows/g/signals", params=params)
    assert r.status_code == 422, r.text
    assert says in r.json()["error"]["message"]


def test_the_openapi_document_declares_the_signals_route(
    api_client: tuple[str, TestClient],
) -> None:
    _, c = api_client
    doc = c.get("/openapi.json").json()
    path = doc["paths"]["/api/workflows/{workflow_id}/signals"]
    assert {"get", "post"} <= set(path)  # beside the route that sends one
    names = {p["name"] for p in path["get"]["parameters"] if p["in"] == "query"}
    assert names == {"limit", "before_num"}
    assert {"404", "422"} <= set(path["get"]["responses"])
    history = doc["paths"]["/api/workflows/{workflow_id}/history"]["get"]
    assert "signals_count" in history["summary"]  # the Spec's description


# --- the work of a page ---------------------------------------------------------------------

MANY = 20_000


def test_a_page_of_many_signals_does_a_page_s_work_not_the_signals(store_url: str) -> None:
    """20,000 signals of 600 characters to one workflow, and as many to another."""
    postgres = store_url.startswith("postgres")
    store: Any = create_store(store_url)
    store.open()
    try:
        store._execute(
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
            "VALUES ('chat', 'agent', 'waiting', '[]', 1, 1), "
            "('other', 'agent', 'waiting', '[]', 2, 2)",
            {},
        )
        words = "'" + "x" * 600 + "'"
        for wid in ("chat", "other"):
            store._execute(
                f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {MANY}) "
                "INSERT INTO signals (workflow_id, num, name, payload, sent_at, consumed_seq) "
                f"SELECT '{wid}', i, 'user-message', {words}, i, i FROM n",
                {},
            )
        store._execute("VACUUM ANALYZE" if postgres else "VACUUM", {})
        pages = {"newest": None, "before the middle": MANY // 2, "before the first": 1}
        found = {name: store.signals_page("chat", b, 50) for name, b in pages.items()}
        assert [s["num"] for s in found["newest"]] == list(range(MANY - 49, MANY + 1))
        assert [s["num"] for s in found["before the middle"]] == list(range(9_950, 10_000))
        assert found["before the first"] == []

        def work(call: Any) -> int:
            return test_query_plans._work(store, postgres, call, relation="signals")

        whole = work(lambda: store.list_signals("chat"))
        each = {
            name: work(lambda b=b: store.signals_page("chat", b, 50)) for name, b in pages.items()
        }
        # a page reads its 50 rows and no more (PostgreSQL counts rows, SQLite a few dozen
        # instructions a row)
        bound = 51 if postgres else 30 * 51
        heavy = {name: n for name, n in each.items() if n > bound}
        assert not heavy, f"pages that read more than their rows (all: {whole}): {heavy}"
        assert whole >= MANY if postgres else whole > 50 * max(each.values())
    finally:
        store.close()
