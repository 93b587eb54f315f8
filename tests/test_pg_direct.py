"""PostgreSQL: statements sent past psycopg's cursor (``pg_direct``) answer as psycopg would.

Each test runs the same statements both ways on a real server and compares what comes
back: the rows and their Python types, the errors and their classes, a lost connection.
The store's own hot path is checked to go this way (its prepared statements are listed
by the server), and what must go through psycopg still does.
"""

from __future__ import annotations

import datetime
import decimal
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest

from durably.storage import pg_direct, postgres
from tests.test_pg_round_trips import pg_store, statements  # noqa: F401 (a fixture)
from tests.test_store import NOW, Verbs, owned, step


@pytest.fixture
def conn(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    url, _ = postgres.split_schema(postgres_url)
    with psycopg.connect(
        url, autocommit=True, prepare_threshold=None
    ) as connection:  # as the store
        yield connection


def sql(text: str) -> str:
    """A statement written as queries.sql writes them (``:name``), in psycopg's style."""
    return postgres._paramstyle(text)


def keyed(conn: psycopg.Connection[Any], table: str) -> tuple[pg_direct.Direct, str]:
    """A Direct on ``conn``, a table of int keys, and the statement inserting one."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (k int PRIMARY KEY)")
    return pg_direct.Direct(conn), sql(f"INSERT INTO {table} VALUES (:k)")


def prepared(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
    return {str(name): str(text) for name, text in rows}


def test_parameters_are_numbered_once_per_name_and_percent_signs_kept() -> None:
    query, names = pg_direct.positional(sql("SELECT :a, :b, :a, '5%', x % 2 FROM t -- 1%"))
    assert names == ("a", "b")
    assert query == b"SELECT $1, $2, $1, '5%', x % 2 FROM t -- 1%"


TYPED = sql(
    "SELECT :int::bigint AS i, :small::int AS s, :real::double precision AS f, :text AS t, "
    ":flag::boolean AS b, :nothing::text AS n, :doc::jsonb AS j, '{\"k\": [1, 2]}'::json AS js, "
    "1.50::numeric AS d, ARRAY['x', 'y'] AS a, '2026-12-05 10:00:00+00'::timestamptz AS ts, "
    "'100%' AS pct"
)
PARAMS = {
    "int": 2**40,
    "small": 7,
    "real": 0.1,
    "text": "héllo \u4e00 ' \" \\",
    "flag": True,
    "nothing": None,
    "doc": '{"a": 1}',
}


def test_rows_come_back_with_the_types_psycopg_gives(conn: psycopg.Connection[Any]) -> None:
    direct = pg_direct.Direct(conn)
    expected = conn.execute(TYPED, PARAMS).fetchall()
    for _ in range(2):  # prepared at the first, reused at the second
        answer = direct.execute(TYPED, PARAMS)
        assert isinstance(answer, pg_direct.Answer)
        got = answer.fetchall()
        assert got == expected
        assert [type(v) for v in got[0]] == [type(v) for v in expected[0]]
    (row,) = expected
    assert row[:7] == (2**40, 7, 0.1, PARAMS["text"], True, None, {"a": 1})
    assert row[7:] == (
        {"k": [1, 2]},
        decimal.Decimal("1.50"),
        ["x", "y"],
        datetime.datetime(2026, 12, 5, 10, tzinfo=datetime.UTC),
        "100%",
    )


def test_rowcount_and_fetchone_read_as_a_cursors(conn: psycopg.Connection[Any]) -> None:
    direct = pg_direct.Direct(conn)
    conn.execute("CREATE TEMPORARY TABLE t (k int PRIMARY KEY, v text)")
    insert = sql("INSERT INTO t SELECT g, :v FROM generate_series(1, :n) AS g")
    assert direct.execute(insert, {"v": "x", "n": 3}).rowcount == 3
    update = direct.execute(sql("UPDATE t SET v = :v WHERE k > :k RETURNING k"), {"v": "y", "k": 1})
    assert update.rowcount == 2
    assert update.fetchone() == (2,)
    assert update.fetchone() == (3,)
    assert update.fetchone() is None
    assert direct.execute(sql("SELECT v FROM t WHERE k = :k"), {"k": 9}).fetchall() == []
    assert direct.execute("SELECT count(*) FROM t", None).fetchone() == (3,)
    every = direct.execute("SELECT k, v FROM t ORDER BY k", None)
    assert every.description is not None
    assert [c[0] for c in every.description] == ["k", "v"]
    assert every.fetchone() == (1, "x")
    assert list(every) == [(2, "y"), (3, "y")]  # the rest, as a cursor iterates
    assert direct.execute(sql("DELETE FROM t WHERE k = :k"), {"k": 1}).description is None


def test_an_interrupt_cancels_the_statement_and_leaves_the_connection_usable(
    conn: psycopg.Connection[Any],
) -> None:
    """Ctrl-C while a statement runs cancels it on the server (psycopg's wait does) and
    its answer is read, so the connection is idle again, neither busy nor broken. (The
    sending is inside that wait too, as in psycopg, so no moment between the two leaves
    a statement running uncancelled.)"""
    direct = pg_direct.Direct(conn)
    sleep = sql("SELECT pg_sleep(:s)")
    direct.execute(sleep, {"s": 0})  # prepared: the next sending is the statement alone
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    began = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            direct.execute(sleep, {"s": 30})
    finally:
        timer.cancel()
    assert time.monotonic() - began < 10
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not conn.broken
    assert direct.execute(sql("SELECT :x::int"), {"x": 7}).fetchone() == (7,)


def test_each_statement_is_prepared_once_a_connection_and_types(
    conn: psycopg.Connection[Any],
) -> None:
    direct = pg_direct.Direct(conn)
    query = sql("SELECT coalesce(:v, 'none') AS v")
    assert direct.execute(query, {"v": "a"}).fetchone() == ("a",)
    assert direct.execute(query, {"v": "b"}).fetchone() == ("b",)
    ours = {k: v for k, v in prepared(conn).items() if k.startswith("durably_")}
    assert list(ours.values()) == ["SELECT coalesce($1, 'none') AS v"]
    # a str and None are both sent untyped (psycopg's way): the same prepared statement
    assert direct.execute(query, {"v": None}).fetchone() == ("none",)
    # an int is typed by its size (int2, int4, int8), as psycopg sends it: one each
    number = sql("SELECT :n::bigint + 0 AS n")
    assert [direct.execute(number, {"n": n}).fetchone() for n in (1, 2, 2**40)] == [
        (1,),
        (2,),
        (2**40,),
    ]
    ours = sorted(v for k, v in prepared(conn).items() if k.startswith("durably_"))
    assert ours == [
        "SELECT $1::bigint + 0 AS n",
        "SELECT $1::bigint + 0 AS n",
        "SELECT coalesce($1, 'none') AS v",
    ]


def test_errors_are_psycopgs_and_leave_the_connection_usable(
    conn: psycopg.Connection[Any],
) -> None:
    direct, insert = keyed(conn, "direct_unique")
    direct.execute(insert, {"k": 1})
    with pytest.raises(psycopg.errors.UniqueViolation) as caught:
        direct.execute(insert, {"k": 1})
    assert caught.value.sqlstate == "23505"
    with pytest.raises(psycopg.errors.UndefinedTable):
        direct.execute(sql("SELECT * FROM no_such_table WHERE k = :k"), {"k": 1})
    with pytest.raises(psycopg.DataError):  # found by psycopg's dumper, as in a cursor
        direct.execute(sql("SELECT :t::text"), {"t": "a\x00b"})
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        direct.execute(sql("SELECT :t::int"), {"t": "x"})
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    count = sql("SELECT count(*) FROM direct_unique WHERE k = :k")
    assert direct.execute(count, {"k": 1}).fetchone() == (1,)


def test_psycopgs_rollback_leaves_our_names_as_the_store_connects(
    conn: psycopg.Connection[Any],
) -> None:
    """psycopg sends DEALLOCATE ALL after a ROLLBACK (or a DROP, an ALTER) it ran only
    when it holds names of its own; on a connection as the store makes it, it prepares
    none, and ours stay, a savepoint's rollback included."""
    direct = pg_direct.Direct(conn)
    query = sql("SELECT :x::int + 1")
    assert direct.execute(query, {"x": 1}).fetchone() == (2,)
    for _ in range(6):  # past psycopg's default threshold of five
        conn.execute("SELECT %(x)s::int", {"x": 1})
    conn.execute("BEGIN")
    conn.execute("SAVEPOINT op")
    conn.execute("ROLLBACK TO SAVEPOINT op")
    conn.execute("ROLLBACK")
    conn.execute("SELECT 2")
    assert sorted(prepared(conn)) == ["durably_0"]
    assert direct.execute(query, {"x": 2}).fetchone() == (3,)


def test_statements_deallocated_by_another_are_prepared_again(
    conn: psycopg.Connection[Any],
) -> None:
    """A DEALLOCATE ALL (or DISCARD ALL) sent by something else takes our names: the next
    sending of a statement alone prepares again, under a new name, and answers."""
    direct = pg_direct.Direct(conn)
    query, other = sql("SELECT :x::int + 1"), sql("SELECT :x::int + 2")
    assert direct.execute(query, {"x": 1}).fetchone() == (2,)
    assert direct.execute(other, {"x": 1}).fetchone() == (3,)
    conn.execute("DEALLOCATE ALL")
    assert not [n for n in prepared(conn) if n.startswith("durably_")]
    for x in (5, 6):
        assert direct.execute(query, {"x": x}).fetchone() == (x + 1,)
        assert direct.execute(other, {"x": x}).fetchone() == (x + 2,)
    assert sorted(n for n in prepared(conn) if n.startswith("durably_")) == [
        "durably_2",
        "durably_3",
    ]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_statements_in_a_transaction_go_past_psycopg_and_a_refused_name_fails_it(
    conn: psycopg.Connection[Any],
) -> None:
    """In an open transaction a statement goes this way too. A name deallocated by
    another is refused there, which aborts the transaction: the error is raised, nothing
    of it is committed, and the next statement is prepared again."""
    direct, insert = keyed(conn, "direct_inside")
    count = sql("SELECT count(*) FROM direct_inside")
    conn.execute("BEGIN")
    assert direct.execute(insert, {"k": 1}).rowcount == 1
    assert direct.execute(count, None).fetchone() == (1,)
    direct.commit()
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert sorted(prepared(conn)) == ["durably_0", "durably_1"]
    conn.execute("BEGIN")
    assert direct.execute(insert, {"k": 2}).rowcount == 1
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        direct.execute(count, None)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):  # psycopg's to refuse
        direct.execute(count, None)
    conn.execute("ROLLBACK")
    assert direct.execute(count, None).fetchone() == (1,)  # prepared again: k=2 undone
    assert sorted(prepared(conn)) == ["durably_2"]


def test_end_with_sends_the_last_statement_and_commit_in_one_pipeline(
    conn: psycopg.Connection[Any],
) -> None:
    """Its answer, the transaction committed; an error in either commits nothing, and
    outside a transaction it declines, having sent nothing."""
    direct, insert = keyed(conn, "direct_end")
    returning = sql("INSERT INTO direct_end VALUES (:k) RETURNING k * 10")
    count = sql("SELECT count(*) FROM direct_end")
    assert direct.end_with(returning, {"k": 1}) is None  # idle: nothing to commit
    conn.execute("BEGIN")
    assert direct.execute(insert, {"k": 1}).rowcount == 1
    result = direct.end_with(returning, {"k": 2})  # prepared in the same pipeline
    assert result is not None and direct.answer(result).fetchall() == [(20,)]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    conn.execute("BEGIN")
    assert direct.execute(insert, {"k": 3}).rowcount == 1
    with pytest.raises(psycopg.errors.UniqueViolation):
        direct.end_with(returning, {"k": 1})
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS direct_late (k int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
    )
    late = sql("INSERT INTO direct_late VALUES (:k)")
    conn.execute("BEGIN")
    assert direct.execute(late, {"k": 1}).rowcount == 1
    with pytest.raises(psycopg.errors.UniqueViolation):  # found at COMMIT: rolled back
        direct.end_with(late, {"k": 1})
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert direct.execute(count, None).fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM direct_late").fetchone() == (0,)
    conn.execute("BEGIN")
    lone = sql("SELECT :t::text")
    assert direct.end_with(lone, {"t": "caf\udce9"}) is None  # psycopg's to refuse
    assert direct.end_with("SELECT '50%%'", None) is None  # psycopg sends it as it is
    assert conn.execute("SELECT '50%%'").fetchone() == ("50%%",)
    conn.execute("ROLLBACK")
    conn.execute("BEGIN")  # rows that fail to load once committed: the commit stands
    far = sql("INSERT INTO direct_end VALUES (:k) RETURNING 'infinity'::date")
    result = direct.end_with(far, {"k": 9})
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(psycopg.DataError):
        direct.answer(result)
    assert direct.execute(count, None).fetchone() == (3,)


def test_a_lost_connection_raises_operational_error_and_reads_broken(
    conn: psycopg.Connection[Any], postgres_url: str
) -> None:
    direct = pg_direct.Direct(conn)
    query = sql("SELECT :x::int")
    assert direct.execute(query, {"x": 1}).fetchone() == (1,)
    url, _ = postgres.split_schema(postgres_url)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        direct.execute(query, {"x": 2})
    assert conn.broken


def test_what_psycopg_must_send_goes_through_psycopg(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = pg_direct.Direct(conn)
    composed = psycopg.sql.SQL("SELECT {}").format(psycopg.sql.Literal(5))
    assert isinstance(direct.execute(composed, None), psycopg.Cursor)
    with conn.pipeline():  # a pipeline's statements are psycopg's to send
        cursor = direct.execute(sql("SELECT :x::int"), {"x": 3})
    assert isinstance(cursor, psycopg.Cursor) and cursor.fetchone() == (3,)
    with pytest.raises(psycopg.ProgrammingError, match="y"):  # psycopg names what is missing
        direct.execute(sql("SELECT :x::int, :y::int"), {"x": 3})
    conn.execute("BEGIN")
    with pytest.raises(psycopg.errors.DivisionByZero):
        direct.execute(sql("SELECT 1 / :x::int"), {"x": 0})
    failed = sql("SELECT :x::int")  # in a failed transaction: psycopg's, which refuses it
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        direct.execute(failed, {"x": 4})
    conn.execute("ROLLBACK")
    monkeypatch.setattr(pg_direct, "PREPARED_MAX", 2)  # the division's, and one more
    assert isinstance(direct.execute(sql("SELECT :x::int + 1"), {"x": 1}), pg_direct.Answer)
    conn.execute("BEGIN")  # full, and in a transaction no DEALLOCATE makes room
    past = direct.execute(sql("SELECT :x::int + 2"), {"x": 1})
    assert isinstance(past, psycopg.Cursor) and past.fetchone() == (3,)
    conn.execute("COMMIT")
    monkeypatch.setattr(pg_direct, "PREPARED_MAX", 0)  # nothing prepared: psycopg sends all
    assert isinstance(direct.execute(sql("SELECT :x::int + 3"), {"x": 1}), psycopg.Cursor)


def test_past_the_limit_the_least_recently_used_names_are_deallocated(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection keeps at most PREPARED_MAX names: one more, from an idle connection,
    deallocates the least recently used eighth (a statement used since is kept), and a
    batch's statements are never the ones deallocated for it."""
    monkeypatch.setattr(pg_direct, "PREPARED_MAX", 16)
    direct = pg_direct.Direct(conn)
    texts = [sql(f"SELECT :x::int + {i}") for i in range(40)]
    for i, text in enumerate(texts[:16]):
        assert direct.execute(text, {"x": 1}).fetchone() == (1 + i,)
    assert direct.execute(texts[0], {"x": 2}).fetchone() == (2,)  # used again: kept
    ours = {n: t for n, t in prepared(conn).items() if n.startswith("durably_")}
    assert len(ours) == 16
    assert direct.execute(texts[16], {"x": 1}).fetchone() == (17,)
    ours = {n: t for n, t in prepared(conn).items() if n.startswith("durably_")}
    # the two least recently used (16 // 8) went: texts 1 and 2, not 0
    assert len(ours) == 15 and sorted(ours) == sorted(f"durably_{i}" for i in [0, *range(3, 17)])
    for i, text in enumerate(texts[17:]):  # a long life: never more than the limit
        assert direct.execute(text, {"x": 0}).fetchone() == (17 + i,)
        assert len([n for n in prepared(conn) if n.startswith("durably_")]) <= 16
    batch = [(texts[i], {"x": 0}) for i in range(10)]
    answers = direct.begin_with(batch)
    assert answers is not None and [a.fetchone() for a in answers] == [(i,) for i in range(10)]
    conn.execute("COMMIT")
    conn.execute("DEALLOCATE ALL")  # another took them: the eviction's DEALLOCATE fails
    for i, text in enumerate(texts[10:30]):
        assert direct.execute(text, {"x": 0}).fetchone() == (10 + i,)
    assert len([n for n in prepared(conn) if n.startswith("durably_")]) <= 16
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_plain_steps_commit_goes_past_psycopgs_cursor(pg_store: Any) -> None:  # noqa: F811 (the fixture)
    """The store's hot path: a step's fence and write, alone in its batch, is sent by
    ``pg_direct`` (its prepared statement is ours) in one round trip as before."""
    db = Verbs(pg_store)
    info = owned(db)
    for seq in (1, 2):
        _, sent = statements(
            pg_store, pg_store.append_entries, "wf-1", info.epoch, [step(seq)], NOW
        )
        assert len(sent) == 1 and pg_store.last_round_trips == 1, sent
    ours = [t for n, t in prepared(pg_store.conn).items() if n.startswith("durably_")]
    assert any("INSERT INTO journal" in text for text in ours), ours
    assert db.load_history("wf-1") == [step(1), step(2)]


def test_begin_with_sends_begin_and_statements_in_one_pipeline(
    conn: psycopg.Connection[Any],
) -> None:
    """One round trip: BEGIN and each statement (prepared first where new), the answers
    in order, the transaction left open for the caller to go on with and commit."""
    direct = pg_direct.Direct(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS direct_t (k int PRIMARY KEY, v text)")
    insert = sql("INSERT INTO direct_t VALUES (:k, :v) RETURNING k")
    count = sql("SELECT count(*) FROM direct_t WHERE v = :v")
    answers = direct.begin_with([(insert, {"k": 1, "v": "a"}), (insert, {"k": 2, "v": "a"})])
    assert answers is not None and [a.fetchall() for a in answers] == [[(1,)], [(2,)]]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    conn.execute("COMMIT")
    more = direct.begin_with([(count, {"v": "a"}), (insert, {"k": 3, "v": "b"})])
    assert more is not None and more[0].fetchone() == (2,) and more[1].rowcount == 1
    conn.execute("ROLLBACK")
    conn.execute("DEALLOCATE ALL")  # (as a pooler's DISCARD ALL would)
    assert direct.execute(count, {"v": "b"}).fetchone() == (0,)
    assert direct.begin_with([(count, {"v": "a"})]) is not None  # prepared again, sent
    conn.execute("COMMIT")


def test_begin_with_rolls_back_and_sends_again_when_another_deallocated(
    conn: psycopg.Connection[Any],
) -> None:
    """A write before the refused name ran in the aborted transaction, rolled back with
    it: sent again, it is applied once."""
    direct, insert = keyed(conn, "direct_once")
    read = sql("SELECT count(*) FROM direct_once WHERE k > :k")
    assert direct.execute(read, {"k": 0}).fetchone() == (0,)  # read prepared, not insert
    conn.execute("DEALLOCATE ALL")
    answers = direct.begin_with([(insert, {"k": 1}), (read, {"k": 0})])
    assert answers is not None and answers[1].fetchone() == (1,)
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM direct_once").fetchone() == (1,)


def test_begin_with_raises_the_first_error_and_declines_what_psycopg_must_send(
    conn: psycopg.Connection[Any],
) -> None:
    direct, insert = keyed(conn, "direct_err")
    with pytest.raises(psycopg.errors.UniqueViolation):
        direct.begin_with([(insert, {"k": 1}), (insert, {"k": 1}), (insert, {"k": 2})])
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT count(*) FROM direct_err").fetchone() == (0,)
    assert direct.begin_with([(insert, {"k": 5})]) is not None  # its name was kept
    assert direct.begin_with([(insert, {"k": 6})]) is None  # in a transaction: declined
    conn.execute("COMMIT")
    lone = sql("SELECT :t::text")
    assert direct.begin_with([(lone, {"t": "caf\udce9"})]) is None  # psycopg's to refuse
    composed = psycopg.sql.SQL("SELECT {}").format(psycopg.sql.Literal(1))
    assert direct.begin_with([(composed, None)]) is None
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT array_agg(k) FROM direct_err").fetchone() == ([5],)


class _CutAfterSending(psycopg.Connection[Any]):
    """A connection whose next wait is interrupted once everything was sent, before any
    answer is read (where a SIGINT could land between the sending and the wait)."""

    cut = False

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self.cut:
            self.cut = False
            next(gen)  # sent and flushed: it now asks to wait for the first answer
            raise KeyboardInterrupt
        return super().wait(gen, *args, **kwargs)


def test_a_pipeline_cut_before_its_answers_leaves_the_connection_broken(
    postgres_url: str,
) -> None:
    """Its answers unread, the connection is closed: the store sees it broken and
    connects again, rather than reading those answers as the next statement's. Nothing
    of the pipeline's transaction is committed."""
    url, _ = postgres.split_schema(postgres_url)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("CREATE TABLE direct_cut (k int PRIMARY KEY)")
        conn = _CutAfterSending.connect(url, autocommit=True, prepare_threshold=None)
        try:
            direct = pg_direct.Direct(conn)
            insert = sql("INSERT INTO direct_cut VALUES (:k)")
            conn.cut = True
            with pytest.raises(KeyboardInterrupt):
                direct.begin_with([(insert, {"k": 1}), (insert, {"k": 2})])
            assert conn.broken
            assert other.execute("SELECT count(*) FROM direct_cut").fetchone() == (0,)
        finally:
            conn.close()
