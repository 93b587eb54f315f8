"""Pages of a workflow's journal (``history_page``, ``history_steps``): what a long
agent's dashboard page and the API's paged history read instead of the whole journal.

Through the real engine and the real stores, on SQLite and PostgreSQL: paging either
way reads every entry exactly once; the edges (an empty journal, a seq past either
end, an unknown workflow, bad arguments) answer plainly; a page's gap lines are the
whole timeline's, cut at the page's edges, and its usage line is the whole journal's;
the dashboard shows the newest page, the count and the links, and keeps the page it
is on; the API pages with what it returns; one page of a 20,000-entry journal does a
page's work, not the journal's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import durably
from durably import journal
from durably.server import app, auth, journal_pages, views
from durably.storage import base, create_store
from tests import test_query_plans
from tests.serverkit import harness
from tests.test_queries import Verbs

BIGINT = 2**63 - 1


@durably.step
async def paged_step(i: int) -> int:
    return i * i


@durably.step(name="llm:paged-chat")
async def paged_model(i: int) -> dict[str, Any]:
    """A model call's journaled answer: its usage is what the usage line sums."""
    return {"model": "gpt-4.1", "usage": {"prompt_tokens": 100 + i, "completion_tokens": 10}}


@durably.workflow(name="paged-agent")
async def paged_agent(n: int) -> int:
    """``n`` steps, every third followed by a model call: 4n/3 entries or so."""
    for i in range(n):
        await paged_step(i)
        if i % 3 == 0:
            await paged_model(i)
    return n


async def _run(url: str, n: int, workflow_id: str = "agent") -> None:
    async with durably.Engine(url) as engine:
        handle = await engine.start(paged_agent, n, workflow_id=workflow_id)
        assert await handle.result(timeout=60) == n


@pytest.fixture
def agent(store_url: str) -> Iterator[tuple[str, durably.Client]]:
    """A finished run of 20 steps and 7 model calls (27 entries), and a Client on it."""
    import asyncio

    asyncio.run(_run(store_url, 20))
    with durably.Client(store_url) as client:
        yield store_url, client


def _forwards(client: durably.Client, wid: str, limit: int) -> list[list[int]]:
    pages, after = [], 0
    while True:
        page = client.history_page(wid, after_seq=after, limit=limit)
        assert len(page) <= limit
        if not page:
            return pages
        pages.append([e.seq for e in page])
        after = page[-1].seq


def _backwards(client: durably.Client, wid: str, limit: int) -> list[list[int]]:
    pages: list[list[int]] = []
    page = client.history_page(wid, limit=limit)
    while page:
        assert len(page) <= limit
        pages.append([e.seq for e in page])
        page = client.history_page(wid, before_seq=page[0].seq, limit=limit)
    return pages


def test_paging_either_way_reads_every_entry_exactly_once(
    agent: tuple[str, durably.Client],
) -> None:
    _, client = agent
    whole = client.history("agent")
    seqs = [e.seq for e in whole]
    assert len(seqs) == 27 and seqs == sorted(seqs)
    for limit in (1, 2, 5, 26, 27, 28, 500):
        forwards = _forwards(client, "agent", limit)
        assert [s for page in forwards for s in page] == seqs, limit
        assert all(len(page) == limit for page in forwards[:-1])
        backwards = _backwards(client, "agent", limit)
        assert [s for page in reversed(backwards) for s in page] == seqs, limit
        assert all(len(page) == limit for page in backwards[:-1])
    # the entries themselves, payloads and all, are the history's
    assert client.history_page("agent", after_seq=0, limit=100) == whole
    assert client.history_page("agent", limit=3) == whole[-3:]
    assert client.history_page("agent", before_seq=seqs[10], limit=4) == whole[6:10]
    assert client.history_page("agent", after_seq=seqs[10], limit=4) == whole[11:15]


def test_the_edges_of_a_journal(agent: tuple[str, durably.Client]) -> None:
    _, client = agent
    last = client.history_mark("agent").last_seq
    assert last == 27
    assert client.history_page("agent", after_seq=last, limit=5) == []
    assert client.history_page("agent", after_seq=BIGINT, limit=5) == []
    assert client.history_page("agent", before_seq=1, limit=5) == []
    assert client.history_page("agent", before_seq=-(2**63), limit=5) == []
    assert [e.seq for e in client.history_page("agent", after_seq=-5, limit=2)] == [1, 2]
    assert [e.seq for e in client.history_page("agent", before_seq=BIGINT, limit=2)] == [26, 27]
    assert [e.seq for e in client.history_page("agent", before_seq=2, limit=2)] == [1]
    # a workflow committed but not yet run has a journal with nothing in it
    client.start("paged-elsewhere", workflow_id="empty")
    assert client.history_page("empty", limit=10) == []
    assert client.history_page("empty", after_seq=0, limit=10) == []
    assert client.history_page("empty", before_seq=5, limit=10) == []
    assert client.history_steps("empty", "llm:") == []


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"limit": 0}, ValueError, "limit=0"),
        ({"limit": -3}, ValueError, "limit=-3"),
        ({"limit": True}, ValueError, "limit=True"),
        ({"limit": 2.0}, ValueError, "limit=2.0"),
        ({"limit": "5"}, ValueError, "limit='5'"),
        ({"limit": 2**63}, ValueError, "limit="),
        ({"limit": 5, "after_seq": 1, "before_seq": 9}, ValueError, "give one of them"),
        ({"limit": 5, "after_seq": "3"}, ValueError, "after_seq='3'"),
        ({"limit": 5, "before_seq": 1.5}, ValueError, "before_seq=1.5"),
        ({"limit": 5, "before_seq": 2**63}, ValueError, "before_seq="),
        ({"limit": 5, "after_seq": False}, ValueError, "after_seq=False"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    agent: tuple[str, durably.Client], kwargs: dict[str, Any], error: type, says: str
) -> None:
    _, client = agent
    with pytest.raises(error, match=re.escape(says)):
        client.history_page("agent", **kwargs)
    with pytest.raises(error, match=re.escape(says)):  # before the id is looked for
        client.history_page("nobody", **kwargs)


def test_an_unknown_workflow_is_not_found_and_a_bad_id_or_prefix_refused(
    agent: tuple[str, durably.Client],
) -> None:
    _, client = agent
    with pytest.raises(durably.WorkflowNotFound, match="nobody"):
        client.history_page("nobody", limit=5)
    with pytest.raises(durably.WorkflowNotFound, match="nobody"):
        client.history_steps("nobody", "llm:")
    with pytest.raises(durably.InvalidName):
        client.history_page("a\x00b", limit=5)
    with pytest.raises(durably.InvalidName, match="name_prefix"):
        client.history_steps("agent", "llm\x00")


def test_history_steps_are_the_steps_named_so_chosen_exactly(
    agent: tuple[str, durably.Client],
) -> None:
    url, client = agent
    calls = client.history_steps("agent", "llm:")
    assert [e.seq for e in calls] == [
        e.seq for e in client.history("agent") if e.name.startswith("llm:")
    ]
    assert len(calls) == 7 and {e.name for e in calls} == {"llm:paged-chat"}
    assert [e.seq for e in client.history_steps("agent")] == [  # every step
        e.seq for e in client.history("agent") if e.kind == "step"
    ]
    import asyncio

    asyncio.run(_run_named(url))
    named = {e.name for e in client.history_steps("named", "x%")}
    assert named == {"x%y"}  # not LIKE: '%' is itself, and case counts
    assert {e.name for e in client.history_steps("named", "llm:")} == {"llm:a"}
    assert {e.name for e in client.history_steps("named", "LLM:")} == {"LLM:b"}
    assert {e.name for e in client.history_steps("named", "x_")} == {"x_z"}


@durably.workflow(name="paged-named")
async def named() -> None:
    for name in ("llm:a", "LLM:b", "x%y", "xay", "x_z", "xqz", "l"):
        await durably.run_step(lambda: 1, name=name)
    durably.now()  # not a step


async def _run_named(url: str) -> None:
    async with durably.Engine(url) as engine:
        handle = await engine.start(named, workflow_id="named")
        await handle.result(timeout=30)


# --- a page's gap lines and usage line ----------------------------------------------------

T = 1_000_000.0
NAME = "paged-crafted"
ANSWER = json.dumps(
    {"model": "gpt-4.1", "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}
)


def _entry(seq: int, at: float | None = None) -> journal.Entry:
    """Entry ``seq``, written at ``at`` (T + seq): a model call at 2, 5 and 9, else a step."""
    written = T + seq if at is None else at
    if seq in (2, 5, 9):
        return journal.Entry(
            seq, "step", "llm:chat", "completed", 1, ANSWER, written - 0.5, written
        )
    return journal.Entry(seq, "step", f"s{seq}", "completed", 1, str(seq), written - 0.5, written)


def _crafted(url: str, wid: str = "g") -> None:
    """Twelve entries written at T+1 .. T+12 through the store's own verbs: by ex-a from
    its start at T, by ex-b after it took the workflow over at T+6.5 (between entries 6
    and 7), and a third owner's recovery at T+20, after the last entry."""
    store = create_store(url)
    store.open()
    try:
        db = Verbs(store)
        new = base.NewWorkflow(wid, NAME, '{"args": [], "kwargs": {}}', None, None)
        info, created = db.create_workflow(new, "ex-a", T + 6, T)
        assert created
        db.append_entries(wid, info.epoch, [_entry(s) for s in range(1, 7)], T + 6)
        (b,) = db.claim_next("ex-b", [(NAME, None)], T + 12, T + 6.5, 10)
        db.append_entries(wid, b.epoch, [_entry(s) for s in range(7, 13)], T + 12)
        (c,) = db.claim_next("ex-c", [(NAME, None)], T + 1e6, T + 20, 10)
        assert [x.reason for x in db.load_claims(wid)] == ["start", "recovery", "recovery"]
        assert c.epoch == 3
    finally:
        store.close()


def _append(url: str, wid: str, seqs: range) -> None:
    """Entries the third owner writes after its recovery (at T+20)."""
    store = create_store(url)
    store.open()
    try:
        written = [_entry(s, T + 20 + s) for s in seqs]
        Verbs(store).append_entries(wid, 3, written, T + 40)
    finally:
        store.close()


def _paged_timeline(client: durably.Client, wid: str, limit: int, forwards: bool) -> list[Any]:
    """Every page's timeline rows, one page after another in seq order."""
    pages: list[list[Any]] = []
    page = journal_pages.read(client, wid, after_seq=0 if forwards else None, limit=limit)
    while True:
        claims = client.claims(wid)
        rows = views.timeline(
            page.entries,
            claims,
            before=page.before,
            after=page.after,
            to_end=page.ends_journal,
        )
        pages.append(rows)
        if forwards and page.later_after_seq is not None:
            page = journal_pages.read(client, wid, after_seq=page.later_after_seq, limit=limit)
        elif not forwards and page.earlier_before_seq is not None:
            page = journal_pages.read(client, wid, before_seq=page.earlier_before_seq, limit=limit)
        else:
            break
    ordered = pages if forwards else list(reversed(pages))
    return [row for rows in ordered for row in rows]


def test_a_page_s_gap_lines_are_the_whole_timeline_s_cut_at_its_edges(store_url: str) -> None:
    _crafted(store_url)
    with durably.Client(store_url) as client:
        entries, claims = client.history("g"), client.claims("g")
        whole = views.timeline(entries, claims)
        shape = [r["seq"] if not r["gap"] else "gap" for r in whole]
        assert shape == [1, 2, 3, 4, 5, 6, "gap", 7, 8, 9, 10, 11, 12, "gap"]
        gaps = [r for r in whole if r["gap"]]
        assert [g["seconds"] for g in gaps] == [pytest.approx(0.5), pytest.approx(8.0)]
        for limit in range(1, 14):
            for forwards in (True, False):
                paged = _paged_timeline(client, "g", limit, forwards)
                assert paged == whole, (limit, forwards)
        # the usage line is the whole journal's, from its model calls alone
        calls = journal_pages.model_calls(client, "g")
        assert [e.seq for e in calls] == [2, 5, 9]
        line = views.usage_line(calls, claims)
        assert line == views.usage_line(entries, claims)
        assert line is not None and line.startswith("model usage: 3 model calls")
        assert "recovery replayed 3 model calls" in line  # all before the last recovery


def test_a_gap_before_an_entry_written_out_of_order_is_on_one_page(store_url: str) -> None:
    """Calls in flight together finish out of seq order: entry 5 was cut off by the crash
    and written again after the recovery at T+6.5 (at T+8), entry 6 before it (at T+6).
    The gap goes before 5 in the whole timeline; a page starting after 5 must not show
    it again although the entry just before that page (6) is older than the recovery."""
    store = create_store(store_url)
    store.open()
    try:
        db = Verbs(store)
        new = base.NewWorkflow("late", NAME, '{"args": [], "kwargs": {}}', None, None)
        info, created = db.create_workflow(new, "ex-a", T + 6, T)
        assert created
        db.append_entries("late", info.epoch, [_entry(s) for s in (1, 2, 3, 4, 6)], T + 6)
        (b,) = db.claim_next("ex-b", [(NAME, None)], T + 12, T + 6.5, 10)
        again = [_entry(5, T + 8), *(_entry(s) for s in range(7, 13))]
        db.append_entries("late", b.epoch, again, T + 12)
    finally:
        store.close()
    with durably.Client(store_url) as client:
        whole = views.timeline(client.history("late"), client.claims("late"))
        shape = [r["seq"] if not r["gap"] else "gap" for r in whole]
        assert shape == [1, 2, 3, 4, "gap", 5, 6, 7, 8, 9, 10, 11, 12]
        for limit in range(1, 14):
            for forwards in (True, False):
                assert _paged_timeline(client, "late", limit, forwards) == whole, (
                    limit,
                    forwards,
                )


# --- the dashboard -------------------------------------------------------------------------


def _shown(html: str) -> list[Any]:
    """The timeline's rows as the page shows them: a seq, or "gap"."""
    rows = re.findall(r'<tr class="gap">|<tr class="st-[^"]*"[^>]*>\s*<td class="num">(\d+)', html)
    return [int(seq) if seq else "gap" for seq in rows]


def _links(html: str) -> dict[str, str]:
    """The pager's links by their words (the first pager's)."""
    pager = html.split('<p class="pager">', 1)[1].split("</p>", 1)[0]
    found = re.findall(r'<a href="([^"]+)">([^<]+)</a>', pager)
    return {re.sub("[^a-z]", "", words): href.replace("&amp;", "&") for href, words in found}


def test_the_page_shows_the_newest_entries_the_count_and_the_way_to_the_rest(
    dashboard: tuple[str, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, c = dashboard
    _crafted(url)
    monkeypatch.setattr(journal_pages, "TIMELINE_PAGE", 4)
    newest = c.get("/workflows/g")
    assert newest.status_code == 200
    assert _shown(newest.text) == [9, 10, 11, 12, "gap"]  # the last recovery's gap at the end
    assert "4 of 12 entries (seq 9 to 12)" in newest.text
    assert newest.text.count('<p class="pager">') == 2  # above and below the timeline
    assert _links(newest.text) == {
        "oldest": "/workflows/g?after=0",
        "earlier": "/workflows/g?before=9",
    }
    usage = re.search(r'<p class="usage">([^<]*)</p>', newest.text)
    assert usage is not None and usage.group(1).startswith("model usage: 3 model calls")

    middle = c.get("/workflows/g?before=9")
    assert _shown(middle.text) == [5, 6, "gap", 7, 8]  # the gap where it belongs
    assert "4 of 12 entries (seq 5 to 8)" in middle.text
    assert _links(middle.text) == {
        "oldest": "/workflows/g?after=0",
        "earlier": "/workflows/g?before=5",
        "later": "/workflows/g?after=8",
        "newest": "/workflows/g",
    }
    assert usage.group(0) in middle.text  # the whole workflow's, on every page

    oldest = c.get("/workflows/g?after=0")
    assert _shown(oldest.text) == [1, 2, 3, 4]
    assert _links(oldest.text) == {"later": "/workflows/g?after=4", "newest": "/workflows/g"}
    assert _shown(c.get("/workflows/g?after=4").text) == [5, 6, "gap", 7, 8]
    assert _shown(c.get("/workflows/g?after=6").text) == ["gap", 7, 8, 9, 10]  # a top gap
    assert _shown(c.get("/workflows/g?after=8").text) == [9, 10, 11, 12, "gap"]
    past = c.get("/workflows/g?after=12")
    assert _shown(past.text) == [] and "no entries here, of 12" in past.text
    assert _links(past.text)["earlier"] == "/workflows/g?before=13"

    # the live update fetches the page it is on again (X-Partial): more entries come in,
    # the page keeps its place and says the new count; the newest page moves on
    assert "fetch(location.href" in c.get("/static/live.js").text
    _append(url, "g", range(13, 15))
    again = c.get("/workflows/g?before=9", headers={"X-Partial": "1"})
    assert _shown(again.text) == [5, 6, "gap", 7, 8] and "of 14 entries" in again.text
    moved = c.get("/workflows/g", headers={"X-Partial": "1"})
    assert _shown(moved.text) == [11, 12, "gap", 13, 14]


def test_a_short_journal_is_one_page_without_a_pager(agent: tuple[str, durably.Client]) -> None:
    url, _ = agent
    with TestClient(app.create_app(url, auth.parse_tokens(harness.TOKEN, "test"))) as c:
        harness.login(c, next="/")
        page = c.get("/workflows/agent")
        assert page.status_code == 200 and 'class="pager"' not in page.text
        assert _shown(page.text) == list(range(1, 28))
        assert "model usage: 7 model calls" in page.text


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("before=abc", "?before= takes the seq of a journal entry, not &#39;abc&#39;"),
        ("after=1.5", "?after= takes the seq"),
        ("after=1&before=9", "give one of them"),
        (f"after={2**64}", "?after="),  # the page's parameter, not the store's after_seq
        ("signals_before=abc", "?signals_before= takes the num of a signal, not &#39;abc&#39;"),
        ("signals_before=1.5", "?signals_before= takes the num of a signal"),
        (f"signals_before={2**64}", "?signals_before="),  # the page's name, not before_num
        ("before=x&signals_before=3", "?before= takes the seq"),
    ],
)
def test_a_journal_or_signals_page_named_wrongly_is_a_400_that_says_why(
    dashboard: tuple[str, TestClient], query: str, says: str
) -> None:
    url, c = dashboard
    _crafted(url)
    r = c.get(f"/workflows/g?{query}")
    assert r.status_code == 400, r.text
    assert says in r.text and 'href="/workflows/g"' in r.text
    for fine in ("before=3", "signals_before=3"):  # an unknown id: "not found", as before
        gone = c.get(f"/workflows/nobody?{fine}")
        assert gone.status_code == 200 and "no workflow with id" in gone.text


# --- the API ----------------------------------------------------------------------------------


def test_the_api_pages_the_history_and_says_how_to_fetch_the_next(
    api_client: tuple[str, TestClient],
) -> None:
    url, c = api_client
    _crafted(url)
    whole = c.get("/api/workflows/g/history").json()
    assert "page" not in whole and len(whole["entries"]) == 12  # without parameters: all
    newest = c.get("/api/workflows/g/history", params={"limit": 5}).json()
    assert newest["page"] == {
        "limit": 5,
        "count": 12,
        "first_seq": 8,
        "last_seq": 12,
        "earlier_before_seq": 8,
        "later_after_seq": None,
    }
    assert [e["seq"] for e in newest["entries"]] == [8, 9, 10, 11, 12]
    assert newest["usage"] == whole["usage"] and newest["claims"] == whole["claims"]
    assert newest["signals"] == whole["signals"] == []
    # forwards from the start, by what each page says, sees the whole document's rows
    seen_entries: list[Any] = []
    seen_rows: list[Any] = []
    params: dict[str, Any] = {"after_seq": 0, "limit": 5}
    while True:
        page = c.get("/api/workflows/g/history", params=params).json()
        seen_entries += page["entries"]
        seen_rows += page["timeline"]
        if page["page"]["later_after_seq"] is None:
            break
        params = {"after_seq": page["page"]["later_after_seq"], "limit": 5}
    assert seen_entries == whole["entries"] and seen_rows == whole["timeline"]
    # a seq alone pages with the default size
    default = c.get("/api/workflows/g/history", params={"before_seq": 3}).json()
    assert default["page"]["limit"] == journal_pages.TIMELINE_PAGE
    assert [e["seq"] for e in default["entries"]] == [1, 2]
    assert default["page"]["earlier_before_seq"] is None
    assert default["page"]["later_after_seq"] == 2


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after_seq": "1.5"}, "after_seq"),
        ({"before_seq": str(2**64)}, "before_seq"),
        ({"after_seq": 1, "before_seq": 5}, "give one of them"),
    ],
)
def test_the_api_refuses_bad_paging_with_a_422(
    api_client: tuple[str, TestClient], params: dict[str, Any], says: str
) -> None:
    url, c = api_client
    _crafted(url)
    r = c.get("/api/workflows/g/history", params=params)
    assert r.status_code == 422, r.text
    assert says in r.json()["error"]["message"]
    assert c.get("/api/workflows/nobody/history", params={"limit": 5}).status_code == 404


def test_the_openapi_document_declares_the_paging_parameters(
    api_client: tuple[str, TestClient],
) -> None:
    _, c = api_client
    doc = c.get("/openapi.json").json()
    route = doc["paths"]["/api/workflows/{workflow_id}/history"]["get"]
    names = {p["name"] for p in route["parameters"] if p["in"] == "query"}
    assert names == {"limit", "after_seq", "before_seq"}
    assert "422" in route["responses"]


# --- the work of a page ---------------------------------------------------------------------

LONG = 20_000


def _fill_long(store: Any, postgres: bool) -> None:
    """A journal of 20,000 entries of 1.5 KB answers, beside 20,000 of other workflows."""
    numbers = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) "
    store._execute(
        "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at) "
        "VALUES ('long', 'agent', 'completed', '[]', 1, 1), "
        "('other', 'agent', 'completed', '[]', 2, 2)",
        {},
    )
    big = (
        "(SELECT string_agg(md5(CAST(random() AS TEXT) || CAST(g AS TEXT)), '') "
        "FROM generate_series(1, 47) g)"
        if postgres
        else "hex(randomblob(750))"
    )
    for wid in ("long", "other"):
        store._execute(
            numbers.format(n=LONG)
            + "INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, "
            f"started_at, finished_at) SELECT '{wid}', i, 'step', 'answer', 'completed', 1, "
            f"{big}, i, i FROM n",
            {},
        )
    store._execute("VACUUM ANALYZE" if postgres else "VACUUM", {})  # as autovacuum would


def _work(store: Any, postgres: bool, call: Callable[[], Any]) -> int:
    """The work of what ``call`` sends: journal rows read (PostgreSQL) or virtual machine
    instructions run (SQLite), as test_query_plans counts them."""
    return test_query_plans._work(store, postgres, call, relation="journal")


def test_a_page_of_a_long_journal_does_a_page_s_work_not_the_journal_s(store_url: str) -> None:
    postgres = store_url.startswith("postgres")
    store: Any = create_store(store_url)
    store.open()
    try:
        _fill_long(store, postgres)
        pages = {
            "newest": (None, None),
            "before the middle": (None, LONG // 2),
            "after the middle": (LONG // 2, None),
            "from the start": (0, None),
            "past the end": (LONG, None),
        }
        found = {name: store.history_page("long", a, b, 200) for name, (a, b) in pages.items()}
        assert [e.seq for e in found["newest"]] == list(range(LONG - 199, LONG + 1))
        assert [e.seq for e in found["before the middle"]] == list(range(9_800, 10_000))
        assert [e.seq for e in found["after the middle"]] == list(range(10_001, 10_201))
        assert [e.seq for e in found["from the start"]] == list(range(1, 201))
        assert found["past the end"] == []
        whole = _work(store, postgres, lambda: store.load_history("long"))
        work = {
            name: _work(store, postgres, lambda a=a, b=b: store.history_page("long", a, b, 200))
            for name, (a, b) in pages.items()
        }
        # a page reads its 200 rows and the one past it: PostgreSQL counts rows, SQLite
        # runs a few dozen instructions a row (3,600 for a page, 340,200 for the journal)
        bound = 201 if postgres else 30 * 201
        heavy = {name: n for name, n in work.items() if n > bound}
        assert not heavy, f"pages that read more than their rows (the journal: {whole}): {heavy}"
        assert whole >= LONG if postgres else whole > 50 * max(work.values())
    finally:
        store.close()


def test_a_page_reads_the_gap_window_only_for_a_recovered_workflow(store_url: str) -> None:
    """A page reads one entry on each side of it; 200 only where recoveries left gap lines
    to place (the reads are the page's rows with their payloads)."""
    _crafted(store_url)  # "g": recovered twice
    store = create_store(store_url)
    store.open()
    try:
        db = Verbs(store)
        new = base.NewWorkflow("calm", NAME, '{"args": [], "kwargs": {}}', None, None)
        info, _ = db.create_workflow(new, "ex-a", T + 1e9, T)
        db.append_entries("calm", info.epoch, [_entry(s) for s in range(1, 13)], T + 13)
    finally:
        store.close()
    with durably.Client(store_url) as client:
        asked: list[int] = []
        history_page = client.history_page

        def counted(*args: Any, **kwargs: Any) -> list[journal.Entry]:
            asked.append(kwargs["limit"])
            return history_page(*args, **kwargs)

        client.history_page = counted  # type: ignore[method-assign]
        for wid, window in (("calm", 1), ("g", journal_pages.GAP_WINDOW)):
            asked.clear()
            journal_pages.read(client, wid, limit=5)  # the newest: nothing after it
            assert asked == [5 + window], (wid, asked)
            asked.clear()
            journal_pages.read(client, wid, after_seq=3, limit=5)
            assert asked == [5 + window, window], (wid, asked)
