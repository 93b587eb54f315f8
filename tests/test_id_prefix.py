"""A search by id prefix: exactly the ids that start with the prefix, however the read
goes. Few matches are read as one range of the primary key where the database sorts
text by code point (SQLite's UTF-8 files; a PostgreSQL database whose collation does),
many by the newest-first scan; a collation that sorts otherwise always scans. On both
dialects, with ids of every awkward kind."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import durably
from durably.storage import claims, create_store, sqlbase
from durably.storage.base import WorkflowQuery

#: Ids chosen to trip a wrong range or a wildcard: LIKE's "%" and "_", case, spaces
#: and punctuation a language's collation ignores, accents, a CJK character, an emoji,
#: the last code point before the surrogates and the last of all.
IDS = [
    "a", "a-1", "a-2", "a_3", "a%4", "aB", "ab", "Ab", "a b", "a.c", "a-", "a~",
    "é-1", "e-1", "ea", "z", "order-100", "order-1000", "order-101", "order-2",
    "東京-1", "東京-2", "😀-1", "😀", "a\ud7ff", "a\ud7ff-x", "a\ue000",
    "a\U0010ffff", "a\U0010ffff-x", "b",
]  # fmt: skip

PREFIXES = [
    "a", "a-", "a_", "a%", "aB", "ab", "A", "a ", "a.", "é", "e", "order-1", "order-10",
    "order-", "東京", "😀", "a\ud7ff", "a\U0010ffff", "\U0010ffff", "zz", "c", "o",
]  # fmt: skip


def _insert(store: Any, ids: list[str]) -> None:
    store._begin(True)
    for n, workflow_id in enumerate(ids):
        sql_text = (
            "INSERT INTO workflows (workflow_id, name, status, input, created_at, updated_at)"
            f" VALUES (:id, 'n', 'completed', '[]', {n}, {n})"
        )
        store._execute(store._paramstyle(sql_text), {"id": workflow_id})
    store._commit()


class Sent:
    """The statements a store sends, by text (to tell which read a search made)."""

    def __init__(self, store: Any) -> None:
        self.texts: list[str] = []
        execute = store._execute

        def recording(sql_text: str, params: Any = None) -> Any:
            self.texts.append(sql_text)
            return execute(sql_text, params)

        store._execute = recording

    def ranged(self) -> bool:
        """Whether the last search read the prefix's range of the primary key."""
        searches = [t for t in self.texts if "ORDER BY created_at" in t]
        return "workflow_id >= " in searches[-1]


@pytest.fixture
def store(store_url: str) -> Iterator[Any]:
    opened: Any = create_store(store_url)
    opened.open()
    try:
        _insert(opened, IDS)
        yield opened
    finally:
        opened.close()


def _expected(prefix: str, order: str = "desc") -> list[str]:
    found = [i for i in IDS if i.startswith(prefix)]
    return found[::-1] if order == "desc" else found


def _ids(found: list[Any]) -> list[str]:
    return [w.workflow_id for w in found]


def test_prefix_end_is_the_least_string_after_every_string_with_the_prefix() -> None:
    end = sqlbase.prefix_end
    assert end("abc") == "abd"
    assert end("a-") == "a."
    assert end("a\U0010ffff") == "b"
    assert end("a\U0010ffff\U0010ffff") == "b"
    assert end("\U0010ffff") is None and end("") is None
    assert end("a\ud7ff") == "a\ue000"  # the surrogates are skipped
    rng = random.Random(12)
    alphabet = ["a", "b", "-", "\x00", "é", "\ud7ff", "\ue000", "😀", chr(sys.maxunicode)]
    for _ in range(3_000):
        prefix = "".join(rng.choices(alphabet, k=rng.randint(1, 3)))
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 5)))
        below = end(prefix)
        in_range = prefix <= text and (below is None or text < below)
        assert in_range == text.startswith(prefix), (prefix, text, below)


def test_the_database_is_known_to_sort_ids_by_code_point(store: Any) -> None:
    # SQLite's files are UTF-8; the test cluster is made without a locale ("C")
    assert store.ids_in_code_point_order is True


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_a_search_by_prefix_finds_exactly_the_ids_that_start_with_it(
    store: Any, order: str
) -> None:
    sent = Sent(store)
    for prefix in PREFIXES:  # "a\ud7ff": its range ends at "a\ue000", past the surrogates
        found = _ids(store.search_workflows(WorkflowQuery(id_prefix=prefix, order=order)))
        assert found == _expected(prefix, order), prefix
        assert sent.ranged() == (sqlbase.prefix_end(prefix) is not None), prefix


def test_paging_through_a_prefix_by_cursor_and_offset(store: Any) -> None:
    whole = _expected("a", "asc")
    pages: list[str] = []
    after = None
    while True:
        query = WorkflowQuery(id_prefix="a", order="asc", limit=3, after=after)
        page = store.search_workflows(query)
        pages += _ids(page)
        if len(page) < 3:
            break
        after = (page[-1].created_at, page[-1].workflow_id)
    assert pages == whole
    offset = store.search_workflows(WorkflowQuery(id_prefix="a", limit=2, offset=3))
    assert _ids(offset) == _expected("a")[3:5]


def test_a_page_far_past_the_end_is_empty_not_an_overflow(store: Any) -> None:
    # the range's cap grows with the page's end, and stops at the largest LIMIT
    assert store.search_workflows(WorkflowQuery(id_prefix="a", offset=2**62)) == []
    assert store.search_workflows(WorkflowQuery(id_prefix="a", offset=2**62 - 1, limit=1)) == []


def test_a_prefix_many_ids_have_is_read_by_the_scan_with_the_same_answer(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the cap the range would sort every match: the newest-first scan fills the
    page sooner. Lowered here, so that both reads of the same prefix can be compared."""
    sent = Sent(store)
    ranged = _ids(store.search_workflows(WorkflowQuery(id_prefix="a", limit=2)))
    assert sent.ranged()
    monkeypatch.setattr(claims, "ID_RANGE_CAP", 4)
    monkeypatch.setattr(claims, "ID_RANGE_PER_ROW", 1)
    scanned = _ids(store.search_workflows(WorkflowQuery(id_prefix="a", limit=2)))
    assert not sent.ranged()
    assert scanned == ranged == _expected("a")[:2]
    few = _ids(store.search_workflows(WorkflowQuery(id_prefix="order-10", limit=2)))
    assert sent.ranged() and few == _expected("order-10")[:2]  # 3 ids: under the cap


def test_a_prefix_with_other_filters_and_through_the_client(store_url: str) -> None:
    with durably.Client(store_url) as client:
        store: Any = create_store(store_url)
        store.open()
        try:
            _insert(store, ["x-1", "x-2", "x-3", "y-1"])
            store._execute("UPDATE workflows SET status = 'failed' WHERE workflow_id = 'x-2'")
        finally:
            store.close()
        assert _ids(client.list_workflows(id_prefix="x-")) == ["x-3", "x-2", "x-1"]
        assert _ids(client.list_workflows(id_prefix="x-", status="failed")) == ["x-2"]
        assert _ids(client.list_workflows(id_prefix="x-", ids=["x-1", "y-1"])) == ["x-1"]
        assert _ids(client.list_workflows(id_prefix="x-", created_after=1)) == ["x-3", "x-2"]
        assert _ids(client.list_workflows(id_prefix="w")) == []


def test_a_collation_that_does_not_sort_by_code_point_scans_and_stays_exact(
    pg_cluster: Any,
) -> None:
    """An ICU en-US database sorts "a-b" after "ab" and "B" beside "b": a range of ids
    would miss some that start with the prefix, so the search scans."""
    if pg_cluster.admin().info.server_version < 150000:
        pytest.skip("a database's ICU collation needs PostgreSQL 15")
    name = pg_cluster.create_database(prefix="icu")
    pg_cluster.execute(f"DROP DATABASE {name}")
    try:
        pg_cluster.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' "
            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'"
        )
    except Exception as exc:  # a server built without ICU
        if "ICU" not in str(exc):
            raise
        pytest.skip(f"this PostgreSQL has no ICU: {exc}")
    store: Any = create_store(pg_cluster.url(name))
    try:
        store.open()
        assert store.ids_in_code_point_order is False
        _insert(store, IDS)
        sent = Sent(store)
        for prefix in PREFIXES:
            found = _ids(store.search_workflows(WorkflowQuery(id_prefix=prefix)))
            assert found == _expected(prefix), prefix
            assert not sent.ranged()
    finally:
        store.close()
        pg_cluster.drop_database(name)
