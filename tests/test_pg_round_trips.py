"""PostgreSQL: a step's commit costs one statement for the fence and the write together.

The statements are counted in libpq's own protocol trace of the store's real
connection (a ``Query`` or a ``Sync`` is one statement the client waits for), so
nothing of the store is replaced. The refusals of the one-statement write are
checked here too, including the race it exists for: a claim that bumps the epoch
while the write waits for the row lock.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

import durably
from durably import errors, journal
from durably.storage import (
    base,
    create_store,
    marks,
    pg_ahead,
    pg_direct,
    pg_statements,
    postgres,
    rows,
)
from tests.test_store import (
    LEASE,
    NOW,
    RUNNABLE,
    Verbs,
    claim_next,
    claim_then_fail,
    new,
    owned,
    queued,
    step,
    take_over,
)


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Any]:
    store = create_store(postgres_url)
    store.open()
    yield store
    store.close()


#: As many ops of one query as a group commit sends as one ``executemany``.
MANY = pg_ahead.MANY_AT_LEAST

#: Who sends a group commit's pipeline: libpq through ``pg_direct`` (BEGIN and every
#: statement, one wait), or psycopg's pipeline and ``executemany`` (a wait more a grouped
#: query), which the store falls back to where ``pg_direct`` declines (none prepared).
by_sender = pytest.mark.parametrize("sender", ["libpq", "psycopg"])


def send_by(sender: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if sender == "psycopg":
        monkeypatch.setattr(pg_direct, "PREPARED_MAX", 0)


def traced(store: Any, ops: list[base.Op]) -> list[str]:
    """Run ``ops`` as one batch; every statement sent, BEGIN and COMMIT included.

    A ``Query``, or a ``Sync`` or ``Flush`` after a ``Bind``, is one wait for the server
    (a round trip); a statement sent in the same pipeline as the next one has no wait of
    its own. A ``Sync`` after a ``Flush`` with nothing bound since is a wait too, listed
    as ``"Sync"`` (psycopg's ``executemany`` waits for its answers with a ``Flush``). The
    store prepares each statement at its first use on a connection, in a round trip of
    its own (``Parse``, ``Sync``) that is not one of these: it happens once.
    """
    fd, path = tempfile.mkstemp(suffix=".trace")
    pgconn = store.conn.pgconn
    pgconn.trace(fd)
    pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
    try:
        store.run_batch(ops)
    finally:
        pgconn.untrace()
        with open(path, encoding="utf-8", errors="replace") as f:
            trace = f.read()
        os.close(fd)
        os.unlink(path)
    texts: dict[str, str] = {}  # prepared statement name -> its text, as parsed here
    sent: list[str] = []
    parsing: str | None = None
    bound: str | None = None
    flushed = False
    for line in trace.splitlines():
        fields = line.split("\t")
        message = fields[2] if len(fields) >= 3 and fields[0] == "F" else None
        if message == "Parse":
            name, _, text = (fields[3] if len(fields) > 3 else "").lstrip().partition(" ")
            parsing = name.strip('"')
            texts[parsing] = text
        elif message == "Bind":
            bound = fields[3].split()[1].strip('"')
            parsing = None
        elif message == "Query":
            sent.append(fields[3].strip())
        elif message in ("Sync", "Flush"):
            if bound is not None:  # else the Sync of a preparation: no statement ran
                text = texts.get(bound, "\0" + bound)
                sent.append(re.sub(r'"(\s+\d+(\s+NNNN)*)?\s*$', '"', text))  # not its types
                flushed = message == "Flush"
            elif message == "Sync":  # (a Flush with nothing bound goes with a Sync: no wait)
                if flushed:  # the pipeline's end after a Flush's wait
                    sent.append('"Sync"')
                flushed = False
            bound = parsing = None
        elif not line.startswith(("F", "B")) and parsing is not None:  # more of a Parse
            texts[parsing] += "\n" + line
        else:
            parsing = None
    if any(s.startswith("\0") for s in sent):  # prepared before the trace began
        known = dict(store.conn.execute("SELECT name, statement FROM pg_prepared_statements"))
        sent = [known.get(s[1:], s) if s.startswith("\0") else s for s in sent]
    return sent


def statements(store: Any, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    """Run ``fn`` as one op of its own batch; (its result, the statements it sent).

    BEGIN and COMMIT are the batch's, not the verb's: they are left out.
    """
    op = base.Op(fn, args, write=True)
    sent = traced(store, [op])
    if op.error is not None:
        raise op.error
    store.last_round_trips = len(sent)  # each Sync or Query waits for the server once
    return op.result, [s for s in sent if s.strip('" ') not in ("BEGIN", "COMMIT")]


def parked_waiting(store: Any, workflow_id: str) -> None:
    """Park an owned workflow as waiting (for a signal or a child), with no timer."""
    with store.conn.transaction():
        store.conn.execute(
            "UPDATE workflows SET status = 'waiting', owner = NULL, wake_at = NULL "
            "WHERE workflow_id = %s",
            (workflow_id,),
        )


def test_a_plain_steps_fence_and_write_are_one_statement(pg_store: Any) -> None:
    db = Verbs(pg_store)
    info = owned(db)
    for seq in (1, 2):  # the first and a later one (prepared by then or not: the same)
        cancel, sent = statements(
            pg_store, pg_store.append_entries, "wf-1", info.epoch, [step(seq)], NOW
        )
        assert cancel is False
        assert len(sent) == 1, sent
    assert db.load_history("wf-1") == [step(1), step(2)]


def test_a_plain_steps_whole_commit_is_one_round_trip(pg_store: Any) -> None:
    """A step's commit alone in its batch is one statement sent as its own transaction:
    no BEGIN, no COMMIT, one wait, where a raw BEGIN; INSERT; COMMIT takes three."""
    db = Verbs(pg_store)
    info = owned(db)
    for seq in (1, 2, 3):
        op = base.Op(pg_store.append_entries, ("wf-1", info.epoch, [step(seq)], NOW), True)
        sent = traced(pg_store, [op])
        assert op.error is None
        assert len(sent) == 1, sent
        assert "INSERT INTO journal" in sent[0], sent  # the fused statement, nothing else
    assert db.load_history("wf-1") == [step(1), step(2), step(3)]
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_receipt_with_events_is_one_transaction(pg_store: Any) -> None:
    """A step that published events writes more than the fused statement: BEGIN goes with
    it (pipelined, in its round trip), and the events commit in the same transaction."""
    db = Verbs(pg_store)
    info = owned(db)
    op = base.Op(
        pg_store.commit_receipt, ("wf-1", info.epoch, [step(1)], [("k", '"v"')], NOW), True
    )
    sent = traced(pg_store, [op])
    assert op.error is None
    assert len(sent) == 3 and sent[-1].strip('" ') == "COMMIT", sent  # fused, event, COMMIT
    assert db.load_history("wf-1") == [step(1)]
    assert pg_store.get_event("wf-1", "k") == '"v"'


def test_the_one_statement_commit_ends_the_crashes_counted(pg_store: Any) -> None:
    """A recovery counted a crash; the first new final entry, committed alone as one
    statement, resets the count in that same statement."""
    db = Verbs(pg_store)
    info = owned(db)
    with pg_store.conn.transaction():
        pg_store.conn.execute(
            "UPDATE workflows SET crash_count = 2 WHERE workflow_id = %s", ("wf-1",)
        )
    op = base.Op(pg_store.append_entries, ("wf-1", info.epoch, [step(1, "started")], NOW), True)
    assert len(traced(pg_store, [op])) == 1 and op.error is None
    assert db.get_workflow("wf-1").crash_count == 2  # an intent is not progress
    op = base.Op(pg_store.append_entries, ("wf-1", info.epoch, [step(1)], NOW), True)
    assert len(traced(pg_store, [op])) == 1 and op.error is None
    assert db.get_workflow("wf-1").crash_count == 0


def test_a_batch_that_succeeds_sends_no_savepoint(pg_store: Any) -> None:
    """Group commit of three steps: BEGIN and the three statements sent together, ahead
    of the verbs that read their answers (one round trip), then COMMIT."""
    db = Verbs(pg_store)
    infos = [owned(db, wid) for wid in ("a", "b", "c")]
    ops = [
        base.Op(pg_store.append_entries, (i.workflow_id, i.epoch, [step(1)], NOW), True)
        for i in infos
    ]
    sent = traced(pg_store, ops)
    assert [op.error for op in ops] == [None, None, None]
    assert not any("SAVEPOINT" in s for s in sent), sent
    assert len(sent) == 2 and sent[-1] == '"COMMIT"', sent
    assert [db.load_history(i.workflow_id) for i in infos] == [[step(1)]] * 3


def test_a_group_commit_of_starts_steps_and_finishes_is_two_round_trips(pg_store: Any) -> None:
    """Each op's first statement is known from its arguments: all go ahead, pipelined."""
    db = Verbs(pg_store)
    a, b = owned(db, "a"), owned(db, "b")
    ops = [
        base.Op(pg_store.create_workflow, (new("c"), "ex-a", NOW + LEASE, NOW), True),
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(1), step(2)], NOW), True),
        base.Op(pg_store.finish_workflow, ("b", b.epoch, "completed", "9", None, [], NOW), True),
    ]
    sent = traced(pg_store, ops)
    assert [op.error for op in ops] == [None, None, None]
    # the second entry is the one statement sent after the pipeline
    assert len(sent) == 3 and sent[-1] == '"COMMIT"', sent
    assert ops[0].result[1] is True and ops[0].result[0].owner == "ex-a"
    assert db.load_history("a") == [step(1), step(2)]
    assert db.get_workflow("b").status == "completed" and db.get_workflow("b").output == "9"
    assert ops[2].result == ("completed", None)


def test_a_fenced_op_sent_ahead_fails_alone(pg_store: Any) -> None:
    """An op whose fence does not hold fails; the batch runs again guarded and each of
    the others is applied once."""
    db = Verbs(pg_store)
    b = owned(db, "b")
    take_over(db, "b", "ex-b")  # b's first run is now a zombie
    a, c = owned(db, "a"), owned(db, "c")
    ops = [
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
        base.Op(pg_store.append_entries, ("b", b.epoch, [step(1)], NOW), True),
        base.Op(pg_store.finish_workflow, ("c", c.epoch, "completed", "1", None, [], NOW), True),
    ]
    sent = traced(pg_store, ops)
    assert [type(op.error).__name__ for op in ops] == ["NoneType", "FencedError", "NoneType"]
    assert any("SAVEPOINT" in s for s in sent)  # the second run
    assert db.load_history("a") == [step(1)] and db.load_history("b") == []
    assert db.get_workflow("c").status == "completed"
    assert [(x.epoch, x.reason) for x in db.load_claims("c")] == [(1, "start")]


def test_a_child_finished_in_a_group_commit_wakes_its_parent(
    pg_store: Any, postgres_url: str
) -> None:
    """The finish's later statements (the parent's wake-up, its join) follow the
    statements sent ahead, in the same transaction."""
    db = Verbs(pg_store)
    owned(db, "parent")
    parked_waiting(pg_store, "parent")
    child = base.NewWorkflow("child", "refund", "{}", None, None, parent_id="parent")
    info, _ = db.create_workflow(child, "ex-a", NOW + LEASE, NOW)
    other = owned(db, "other")
    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{pg_store.channel}"')
        ops = [
            base.Op(
                pg_store.finish_workflow,
                ("child", info.epoch, "completed", "2", None, [], NOW),
                True,
            ),
            base.Op(pg_store.append_entries, ("other", other.epoch, [step(1)], NOW), True),
        ]
        sent = traced(pg_store, ops)
        assert [op.error for op in ops] == [None, None]
        # the parent's wake-up is in the finish's own statement (finish_and_wake), so its
        # row is locked in the batch's order, not after every other op's statement
        assert len(sent) == 2 and sent[-1] == '"COMMIT"', sent
        assert _notifications(listener, 1) == [base.Wakeup("join", "parent", "child")]
    assert db.get_workflow("parent").wake_at == NOW
    assert db.load_history("other") == [step(1)]


@pytest.mark.parametrize("parent_first", [False, True], ids=["child-first", "parent-first"])
def test_a_parent_finished_with_its_child_in_a_group_commit_keeps_its_own_time(
    pg_store: Any, parent_first: bool
) -> None:
    """The parent's updated_at is its own finish's, whichever of the two finishes comes
    first in the batch (``base.lock_order`` orders them by id): the child's wake-up of a
    parent it finds finished changes nothing of it."""
    db = Verbs(pg_store)
    owned(db, "parent")
    child = base.NewWorkflow("child", "refund", "{}", None, None, parent_id="parent")
    info, _ = db.create_workflow(child, "ex-a", NOW + LEASE, NOW)
    parent = db.get_workflow("parent")
    ops = [
        base.Op(
            pg_store.finish_workflow,
            ("child", info.epoch, "completed", "1", None, [], NOW + 5),
            True,
        ),
        base.Op(
            pg_store.finish_workflow,
            ("parent", parent.epoch, "completed", "2", None, [], NOW + 9),
            True,
        ),
    ]
    traced(pg_store, ops[::-1] if parent_first else ops)
    assert [op.error for op in ops] == [None, None]
    assert db.get_workflow("parent").updated_at == NOW + 9


@pytest.mark.parametrize(
    "grouped", [False, "libpq", "psycopg"], ids=["one-by-one", "libpq", "executemany"]
)
def test_values_refused_in_statements_sent_ahead_fail_their_own_ops(
    pg_store: Any, grouped: str | bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value psycopg cannot send (a lone surrogate), one the server refuses (a NUL in
    text, a seq past bigint): those ops fail with StorageDataError, the others are
    applied once, and the connection is left with no transaction open; whether the
    statements went one by one or as one ``executemany`` (with enough other workflows'
    steps), which raises in the middle of its ops."""
    db = Verbs(pg_store)
    a, b, c, d = (owned(db, wid) for wid in "abcd")
    surrogate = journal.Entry(1, "step", "get", "completed", 1, '"caf\udce9"', NOW, NOW + 1)
    nul = journal.Entry(1, "step", "get", "completed", 1, '"x\x00"', NOW, NOW + 1)
    huge = journal.Entry(2**70, "step", "get", "completed", 1, "1", NOW, NOW + 1)
    ops = [
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
        base.Op(pg_store.append_entries, ("b", b.epoch, [surrogate], NOW), True),
        base.Op(pg_store.append_entries, ("c", c.epoch, [nul], NOW), True),
        base.Op(pg_store.append_entries, ("d", d.epoch, [huge], NOW), True),
    ]
    pals = [owned(db, f"pal{k}") for k in range(MANY)] if grouped else []
    ops += [
        base.Op(pg_store.append_entries, (p.workflow_id, p.epoch, [step(1)], NOW), True)
        for p in pals
    ]
    calls: list[int] = []  # the executemany psycopg was asked for: each's size
    executemany = psycopg.Cursor.executemany

    def counted(cursor: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        calls.append(len(params_seq))
        return executemany(cursor, query, params_seq, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "executemany", counted)
    send_by(str(grouped), monkeypatch)
    pg_store.run_batch(ops)
    # grouped, psycopg's executemany raises in the middle, then the guarded run: a value
    # psycopg cannot send (the surrogate) is its to refuse, so libpq declines the batch
    assert calls == ([4 + MANY] if grouped else []), calls
    errors_seen = [type(op.error).__name__ for op in ops]
    assert errors_seen[:4] == [
        "NoneType",
        "StorageDataError",
        "StorageDataError",
        "StorageDataError",
    ]
    assert errors_seen[4:] == ["NoneType"] * len(pals)
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert db.load_history("a") == [step(1)]
    assert [db.load_history(w) for w in "bcd"] == [[], [], []]
    assert [db.load_history(p.workflow_id) for p in pals] == [[step(1)]] * len(pals)


def test_a_value_the_server_refuses_inside_an_executemany_fails_its_own_op(
    pg_store: Any,
) -> None:
    """A seq past bigint among steps sent as one ``executemany``: the server refuses it
    while psycopg waits for the answers; that op fails with StorageDataError, the
    others are applied once, and no transaction is left open."""
    db = Verbs(pg_store)
    infos = [owned(db, f"w{k}") for k in range(MANY)]
    huge = journal.Entry(2**70, "step", "get", "completed", 1, "1", NOW, NOW + 1)
    ops = [
        base.Op(
            pg_store.append_entries,
            (i.workflow_id, i.epoch, [huge if k == 5 else step(1)], NOW),
            True,
        )
        for k, i in enumerate(infos)
    ]
    sent = traced(pg_store, ops)
    assert any("SAVEPOINT" in s for s in sent)  # the first try failed, the second guarded
    assert [type(op.error).__name__ for op in ops] == [
        "StorageDataError" if k == 5 else "NoneType" for k in range(MANY)
    ]
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert [db.load_history(f"w{k}") for k in range(MANY)] == [
        [] if k == 5 else [step(1)] for k in range(MANY)
    ]


def test_a_latin1_database_refuses_what_it_cannot_hold_in_a_group_commit(
    pg_cluster: Any,
) -> None:
    """Text outside LATIN1 fails while psycopg queues the statement (an encoding error,
    not a psycopg one): the batch still ends with the other op applied once and its row
    free."""
    pg_cluster.execute(
        "CREATE DATABASE ahead_latin1 TEMPLATE template0 ENCODING 'LATIN1' "
        "LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    store = create_store(pg_cluster.url("ahead_latin1"))
    store.open()
    try:
        db = Verbs(store)
        a, b = owned(db, "a"), owned(db, "b")
        japanese = journal.Entry(1, "step", "get", "completed", 1, '"\u65e5\u672c"', NOW, NOW + 1)
        ops = [
            base.Op(store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
            base.Op(store.append_entries, ("b", b.epoch, [japanese], NOW), True),
        ]
        store.run_batch(ops)
        assert [type(op.error).__name__ for op in ops] == ["NoneType", "StorageDataError"]
        assert store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with psycopg.connect(pg_cluster.url("ahead_latin1"), autocommit=True) as other:
            other.execute("SET lock_timeout = '2s'")
            other.execute(f"SET search_path = {store.schema}")
            other.execute("SELECT 1 FROM workflows WHERE workflow_id = 'a' FOR UPDATE")
        assert db.load_history("a") == [step(1)] and db.load_history("b") == []
    finally:
        store.close()


def test_a_deduplicated_start_is_not_sent_ahead(pg_store: Any) -> None:
    """Its statement's answer may depend on another op of the batch (a finish that frees
    the deduplication id): the batch runs statement by statement, in its order."""
    db = Verbs(pg_store)
    first = base.NewWorkflow("z", "refund", "{}", None, None, queue="q", deduplication_id="d")
    z, _ = db.create_workflow(first, "ex-a", NOW + LEASE, NOW)
    again = base.NewWorkflow("x", "refund", "{}", None, None, queue="q", deduplication_id="d")
    ops = [
        base.Op(pg_store.create_workflow, (again, "ex-a", NOW + LEASE, NOW), True),
        base.Op(pg_store.finish_workflow, ("z", z.epoch, "completed", "1", None, [], NOW), True),
    ]
    sent = traced(pg_store, ops)
    assert [op.error for op in ops] == [None, None]
    assert not any("SAVEPOINT" in s for s in sent), sent
    found, created = ops[0].result
    assert (found.workflow_id, created) == ("z", False)  # z held the id when x was started


def test_a_start_of_an_existing_id_in_a_group_commit_finds_it(pg_store: Any) -> None:
    db = Verbs(pg_store)
    first = owned(db, "a")
    ops = [
        base.Op(pg_store.create_workflow, (new("a"), "ex-b", NOW + LEASE, NOW + 1), True),
        base.Op(pg_store.create_workflow, (new("b"), "ex-b", NOW + LEASE, NOW + 1), True),
    ]
    traced(pg_store, ops)
    (found, created), (made, made_now) = ops[0].result, ops[1].result
    assert (found.owner, found.epoch, created) == (first.owner, first.epoch, False)
    assert (made.owner, made_now) == ("ex-b", True)


def test_an_answer_out_of_a_statement_sent_for_several_reads_as_a_cursor(
    pg_store: Any,
) -> None:
    """Each op reads its part of a statement sent once for several ops (``executemany``)
    as it would a cursor of its own: its own row, its columns by name (``rows.first``),
    its row count; an op whose fence did not hold finds no row."""
    db = Verbs(pg_store)
    infos = [owned(db, f"w{k}") for k in range(MANY)]
    with pg_store.conn.transaction():  # w3 claimed again since: its fence fails
        pg_store.conn.execute("UPDATE workflows SET epoch = epoch + 1 WHERE workflow_id = 'w3'")
        for k in range(MANY):
            pg_store.conn.execute(
                "UPDATE workflows SET deadline_at = %s WHERE workflow_id = %s",
                (NOW + 1000 + k, f"w{k}"),
            )
    ops = [
        base.Op(pg_store.append_entries, (i.workflow_id, i.epoch, [step(1)], NOW), True)
        for i in infos
    ]
    planned = [
        [pg_statements.Ahead(pg_store._queries[query], params)]
        for _, query, params in map(pg_store._statement_ahead, ops)
    ]
    conn = pg_store.conn
    with conn.pipeline():
        conn.execute("BEGIN")
        answers = pg_ahead._send(conn, planned)
    sent = answers()
    conn.execute("ROLLBACK")
    assert [ahead for ((ahead, _),) in sent] == [p[0] for p in planned]
    assert all(isinstance(answer, pg_direct.Answer) for ((_, answer),) in sent)
    read = [rows.first(answer) for ((_, answer),) in sent]
    assert read[3] is None and sent[3][0][1].rowcount == 0
    assert [r and (r["deadline_at"], r["written"]) for r in read] == [
        None if k == 3 else (NOW + 1000 + k, 1) for k in range(MANY)
    ]
    assert set(read[0]) == {"cancel_requested", "crash_count", "deadline_at", "written"}
    assert sent[0][0][1].rowcount == 1 and sent[0][0][1].fetchone() is None


@by_sender
def test_ops_of_one_query_in_a_group_commit_each_get_their_own_answer(
    pg_store: Any, sender: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starts and steps interleaved, enough of each to go as one ``executemany`` a query,
    with answers that differ: a start of an id that exists (no row, so the verb reads
    the row after the pipeline), steps of workflows asked to cancel (their commit says
    so), one whose crashes counted its commit resets; three finishes among them go one by
    one, before. Each op gets its own answer; a wait more per grouped query, no
    savepoint."""
    db = Verbs(pg_store)
    steps_of = [owned(db, f"s{k}") for k in range(MANY)]
    done_of = [owned(db, f"d{k}") for k in range(3)]
    there = owned(db, "n2", owner="ex-old")
    with pg_store.conn.transaction():
        pg_store.conn.execute(
            "UPDATE workflows SET cancel_requested = 1 WHERE workflow_id IN ('s1', 's2')"
        )
        pg_store.conn.execute("UPDATE workflows SET crash_count = 2 WHERE workflow_id = 's4'")
    start, append, finish = (
        pg_store.create_workflow, pg_store.append_entries, pg_store.finish_workflow
    )  # fmt: skip
    ops = []
    for k in range(MANY):
        s = steps_of[k]
        ops += [
            base.Op(start, (new(f"n{k}"), "ex-b", NOW + LEASE, NOW + 1), True),
            base.Op(append, (s.workflow_id, s.epoch, [step(1, payload=f'"{k}"')], NOW), True),
        ]
        if k < 3:
            d = done_of[k]
            done = (
                d.workflow_id,
                d.epoch,
                "failed" if k == 1 else "completed",
                None,
                None,
                [],
                NOW,
            )
            ops.append(base.Op(finish, done, True))
    send_by(sender, monkeypatch)
    sent = traced(pg_store, ops)
    assert [op.error for op in ops] == [None] * len(ops)
    assert not any("SAVEPOINT" in s for s in sent), sent
    if sender == "psycopg":  # a wait per grouped query (its executemany), the pipeline's end
        assert len(sent) == 2 + 1 + 1 + 1 and sent[2] == '"Sync"', sent
    else:  # the whole pipeline, one wait
        assert len(sent) == 1 + 1 + 1 and '"Sync"' not in sent, sent
    assert "One workflow's row" in sent[-2] and sent[-1] == '"COMMIT"', sent  # n2's row
    starts = [op.result for op in ops if op.fn == start]
    assert [(info.workflow_id, created) for info, created in starts] == [
        (f"n{k}", k != 2) for k in range(MANY)
    ]
    assert (starts[2][0].owner, starts[2][0].epoch) == ("ex-old", there.epoch)
    assert [(c.epoch, c.reason) for c in db.load_claims("n5")] == [(1, "start")]
    assert [op.result for op in ops if op.fn == append] == [k in (1, 2) for k in range(MANY)]
    assert [db.load_history(f"s{k}") for k in range(MANY)] == [
        [step(1, payload=f'"{k}"')] for k in range(MANY)
    ]
    assert db.get_workflow("s4").crash_count == 0
    assert [op.result for op in ops if op.fn == finish] == [
        ("completed", None), ("failed", None), ("completed", None)
    ]  # fmt: skip
    assert [db.get_workflow(f"d{k}").status for k in range(3)] == [
        "completed", "failed", "completed"
    ]  # fmt: skip


@by_sender
def test_a_fenced_finish_among_many_fails_alone(
    pg_store: Any, sender: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finishes sent as one ``executemany``, one of them fenced off (taken over): that
    one fails, whatever the others' answers; the batch runs again guarded and each
    other finish is applied once."""
    db = Verbs(pg_store)
    done_of = [owned(db, f"d{k}") for k in range(MANY)]
    with pg_store.conn.transaction():  # d2 claimed again since: its fence fails
        pg_store.conn.execute("UPDATE workflows SET epoch = epoch + 1 WHERE workflow_id = 'd2'")
    ops = [
        base.Op(
            pg_store.finish_workflow,
            (d.workflow_id, d.epoch, "completed", f'"{k}"', None, [], NOW),
            True,
        )
        for k, d in enumerate(done_of)
    ]
    send_by(sender, monkeypatch)
    sent = traced(pg_store, ops)
    assert ('"Sync"' in sent) == (sender == "psycopg")  # the first try as one executemany
    assert [type(op.error).__name__ for op in ops] == [
        "FencedError" if k == 2 else "NoneType" for k in range(MANY)
    ]
    assert [db.get_workflow(f"d{k}").status for k in range(MANY)] == [
        "running" if k == 2 else "completed" for k in range(MANY)
    ]
    assert [db.get_workflow(f"d{k}").output for k in range(MANY)] == [
        None if k == 2 else f'"{k}"' for k in range(MANY)
    ]


def test_a_verb_that_sends_another_statement_first_runs_its_batch_as_usual(
    postgres_url: str,
) -> None:
    """The statement sent ahead must be the verb's first; if it is not (a plan that is
    wrong), nothing of it is kept: the batch is rolled back and runs statement by
    statement, each op applied once."""

    class Mistaken(type(create_store(postgres_url))):  # type: ignore[misc]
        def _statement_ahead(self, op: base.Op) -> Any:
            planned = super()._statement_ahead(op)
            if planned is None or op.args[0] != "b":
                return planned
            wid, _, params = planned  # b's entry, planned at another seq
            return wid, "fence_and_write_entry", {**params, "seq": 7}

    store = Mistaken(postgres_url)
    store.open()
    try:
        db = Verbs(store)
        a, b = owned(db, "a"), owned(db, "b")
        ops = [
            base.Op(store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
            base.Op(store.append_entries, ("b", b.epoch, [step(1)], NOW), True),
        ]
        sent = traced(store, ops)
        assert [op.error for op in ops] == [None, None]
        assert len(sent) > 2, sent  # the pipeline, its rollback, then one by one
        assert db.load_history("a") == [step(1)] and db.load_history("b") == [step(1)]
    finally:
        store.close()


def test_a_group_commit_after_the_connection_was_lost_is_applied_once(
    pg_store: Any, postgres_url: str
) -> None:
    db = Verbs(pg_store)
    a, b = owned(db, "a"), owned(db, "b")
    pid = pg_store.conn.info.backend_pid
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the server has ended it
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            row = admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            if row.fetchone() is None:
                break
        time.sleep(0.01)
    ops = [
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
        base.Op(pg_store.append_entries, ("b", b.epoch, [step(1)], NOW), True),
    ]
    pg_store.run_batch(ops)
    assert [op.error for op in ops] == [None, None]
    assert db.load_history("a") == [step(1)] and db.load_history("b") == [step(1)]


def test_a_batch_with_a_failing_op_runs_again_guarded_and_applies_each_op_once(
    pg_store: Any,
) -> None:
    db = Verbs(pg_store)
    b = owned(db, "b")
    take_over(db, "b", "ex-b")  # b's first run is now a zombie
    a = owned(db, "a")
    ops = [
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(1)], NOW), True),
        base.Op(pg_store.append_entries, ("b", b.epoch, [step(1)], NOW), True),
        base.Op(pg_store.send_signal, ("a", "go", "1", None, NOW), True),
        base.Op(pg_store.append_entries, ("a", a.epoch, [step(2)], NOW), True),
    ]
    sent = traced(pg_store, ops)
    assert [type(op.error).__name__ for op in ops] == [
        "NoneType", "FencedError", "NoneType", "NoneType"
    ]  # fmt: skip
    assert any("SAVEPOINT" in s for s in sent)  # the second run
    assert db.load_history("a") == [step(1), step(2)]
    assert db.load_history("b") == []
    assert [s["name"] for s in db.list_signals("a")] == ["go"]  # sent once, not twice


def test_finish_and_park_fence_and_first_write_are_one_statement(pg_store: Any) -> None:
    db = Verbs(pg_store)
    a, b = owned(db, "a"), owned(db, "b")
    _, sent = statements(
        pg_store, pg_store.finish_workflow, "a", a.epoch, "completed", "1", None, [step(1)], NOW
    )
    assert len(sent) == 2, sent  # the fenced write, then the workflow's final row
    assert db.get_workflow("a").status == "completed"
    sleep = journal.Entry(1, "sleep", "nap", "pending", 1, None, NOW, None, NOW + 60)
    parked, sent = statements(
        pg_store, pg_store.park, "b", b.epoch, "sleeping", NOW + 60, [sleep], [], [], NOW
    )
    assert parked is True
    assert len(sent) == 3, sent  # the fenced write, the park, its timer's wake-up
    assert db.load_history("b") == [sleep]


def test_a_plain_start_and_finish_are_one_statement_each(pg_store: Any) -> None:
    """A start writes the row and its claim in one statement and returns the row
    (RETURNING, no SELECT after); with nothing staged, the fence and the final row are
    one UPDATE."""
    db = Verbs(pg_store)
    op = base.Op(pg_store.create_workflow, (new("a"), "ex-a", NOW + LEASE, NOW), True)
    sent = traced(pg_store, [op])
    info, created = op.result
    assert created and info.workflow_id == "a" and info.epoch == 1 and info.owner == "ex-a"
    assert len(sent) == 1, sent  # the row (returned) and its claim, alone: no BEGIN, no SELECT
    assert [(c.epoch, c.owner, c.reason) for c in db.load_claims("a")] == [(1, "ex-a", "start")]
    _, sent = statements(
        pg_store, pg_store.finish_workflow, "a", info.epoch, "completed", "1", None, [], NOW
    )
    assert len(sent) == 1, sent
    assert db.get_workflow("a").status == "completed"
    assert db.get_workflow("a").owner is None


def test_a_plain_finishs_whole_commit_is_one_round_trip(pg_store: Any) -> None:
    """A finish with nothing staged, alone in its batch, is one statement sent as its own
    transaction (finish_and_wake): no BEGIN, no COMMIT (it was BEGIN with it, COMMIT)."""
    db = Verbs(pg_store)
    info = owned(db, "a")
    op = base.Op(pg_store.finish_workflow, ("a", info.epoch, "completed", "1", None, [], NOW), True)
    sent = traced(pg_store, [op])
    assert op.error is None and op.result == ("completed", None)
    assert len(sent) == 1, sent
    assert "UPDATE workflows" in sent[0], sent
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    row = db.get_workflow("a")
    assert (row.status, row.output, row.owner, row.lease_expires_at) == (
        "completed",
        "1",
        None,
        None,
    )


def _notifications(listener: psycopg.Connection[Any], count: int) -> list[base.Wakeup]:
    from durably.storage import sqlbase

    got = [n.payload for n in listener.notifies(timeout=5, stop_after=count)]
    return [sqlbase.decode_wakeup(p) for p in got]


def test_a_finish_in_one_statement_wakes_its_parent_and_tells_listeners(
    pg_store: Any, postgres_url: str
) -> None:
    """The one statement of a child's finish wakes its waiting parent and notifies the
    parent's join; a queued workflow's finish notifies a free place in its queue."""
    db = Verbs(pg_store)
    owned(db, "parent")
    parked_waiting(pg_store, "parent")  # waiting for its child
    child = base.NewWorkflow("child", "refund", "{}", None, None, parent_id="parent")
    info, _ = db.create_workflow(child, "ex-a", NOW + LEASE, NOW)
    in_queue = base.NewWorkflow("in-queue", "refund", "{}", None, None, queue="llm")
    queued_info, _ = db.create_workflow(in_queue, "ex-a", NOW + LEASE, NOW)
    with psycopg.connect(postgres_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{pg_store.channel}"')
        op = base.Op(
            pg_store.finish_workflow, ("child", info.epoch, "completed", "2", None, [], NOW), True
        )
        assert len(traced(pg_store, [op])) == 1 and op.error is None
        assert _notifications(listener, 1) == [base.Wakeup("join", "parent", "child")]
        done = base.Op(
            pg_store.finish_workflow,
            ("in-queue", queued_info.epoch, "completed", "3", None, [], NOW),
            True,
        )
        assert len(traced(pg_store, [done])) == 1 and done.error is None
        assert _notifications(listener, 1) == [base.Wakeup("work")]
    assert db.get_workflow("parent").wake_at == NOW  # due now: a claimer takes it
    assert db.get_workflow("child").status == "completed"


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
def test_a_join_wake_up_of_a_non_ascii_id_reaches_the_listener(
    pg_cluster: Any, encoding: str
) -> None:
    """The join notification built by the server holds the child's id as text: on a
    LATIN1 database too the engine's listener decodes it (it listens in UTF-8), and
    keeps listening (before: UnicodeDecodeError ended its thread)."""
    name = f"notify_{encoding.lower()}"
    pg_cluster.execute(
        f"CREATE DATABASE {name} TEMPLATE template0 ENCODING '{encoding}' "
        "LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    store = create_store(pg_cluster.url(name))
    store.open()
    got: list[base.Wakeup] = []
    stop = store.listen(got.append)
    try:
        db = Verbs(store)
        owned(db, "parent")
        child = base.NewWorkflow("caf\u00e9", "refund", "{}", None, None, parent_id="parent")
        info, _ = db.create_workflow(child, "ex-a", NOW + LEASE, NOW)
        deadline = time.monotonic() + 10
        while not got:  # the listener is connected once a wake-up reaches it
            assert time.monotonic() < deadline, "the listener never heard a wake-up"
            op = base.Op(store._wake, ("work",), True)
            store.run_batch([op])
            time.sleep(0.05)
        db.finish_workflow("caf\u00e9", info.epoch, "completed", "2", None, [], NOW)
        joined = base.Wakeup("join", "parent", "caf\u00e9")
        while joined not in got:
            assert time.monotonic() < deadline, got
            time.sleep(0.02)
        got.clear()
        store.run_batch([base.Op(store._wake, ("work",), True)])
        while base.Wakeup("work") not in got:  # still listening
            assert time.monotonic() < deadline, got
            time.sleep(0.02)
    finally:
        stop()
        store.close()


def test_a_finish_whose_fence_does_not_hold_ends_in_a_transaction(pg_store: Any) -> None:
    """A finish asked to stop is not ended by the one statement (its fence does not hold):
    the fence and the final row follow in a transaction of their own, BEGIN to COMMIT,
    and the workflow ends ``cancelled`` with its output kept."""
    db = Verbs(pg_store)
    info = owned(db, "a")
    with pg_store.conn.transaction():
        pg_store.conn.execute("UPDATE workflows SET cancel_requested = 1 WHERE workflow_id = 'a'")
    op = base.Op(pg_store.finish_workflow, ("a", info.epoch, "completed", "1", None, [], NOW), True)
    sent = traced(pg_store, [op])
    assert op.error is None and op.result[0] == "cancelled", op.result
    verbs = [s for s in sent if s.strip('" ') not in ("BEGIN", "COMMIT")]
    assert len(verbs) == 3, sent  # the one statement, then the fence and the final row
    bare = [s.strip('" ') for s in sent]
    # BEGIN goes in one pipeline with the fence (no wait of its own); the COMMIT at the end
    # shows the two were one transaction (after a statement alone, none is open).
    assert bare[-1] == "COMMIT" and len(bare) == 4, sent
    row = db.get_workflow("a")
    assert (row.status, row.output, row.owner) == ("cancelled", "1", None)


def test_a_finish_sent_again_finds_its_own_write(pg_store: Any) -> None:
    """A finish sent again (its connection lost before the answer came) finds the row it
    ended and answers as the first did; a different finish of that epoch is fenced off."""
    db = Verbs(pg_store)
    info = owned(db, "a")
    first = db.finish_workflow("a", info.epoch, "completed", "1", None, [], NOW)
    again = base.Op(
        pg_store.finish_workflow, ("a", info.epoch, "completed", "1", None, [], NOW), True
    )
    assert len(traced(pg_store, [again])) == 1
    assert again.error is None and again.result == first == ("completed", None)
    later = base.Op(
        pg_store.finish_workflow, ("a", info.epoch, "completed", "1", None, [], NOW + 1), True
    )
    traced(pg_store, [later])
    assert isinstance(later.error, errors.FencedError), later.error


def appender(store: Any, grouped: str | bool) -> Callable[..., Any]:
    """``append_entries`` as a batch of its own (the step commit's single statement), or
    among other workflows' step commits in one group commit, enough of them to go as
    one ``executemany`` (``grouped="psycopg"``, ``pg_ahead._send``) or as one pipeline
    of libpq's (``"libpq"``, ``pg_direct``): the entry rules below hold for each."""
    db, pals = Verbs(store), iter(range(1000))

    def append(workflow_id: str, epoch: int, written: list[journal.Entry], now: float) -> Any:
        if not grouped:
            return db.append_entries(workflow_id, epoch, written, now)
        others = [owned(db, f"pal-{next(pals)}") for _ in range(pg_ahead.MANY_AT_LEAST - 1)]
        ops = [
            base.Op(store.append_entries, (pal.workflow_id, pal.epoch, [step(1)], now), True)
            for pal in others
        ]
        ops.insert(3, base.Op(store.append_entries, (workflow_id, epoch, written, now), True))
        with pytest.MonkeyPatch.context() as patching:
            send_by(grouped, patching)
            sent = traced(store, ops)
        # psycopg: the executemany's wait, then the pipeline's end; libpq: one wait
        assert ('"Sync"' in sent) == (grouped == "psycopg"), sent
        mine = ops.pop(3)
        assert [op.error for op in ops] == [None] * len(others)
        assert [db.load_history(pal.workflow_id) for pal in others] == [[step(1)]] * len(others)
        if mine.error is not None:
            raise mine.error
        return mine.result

    return append


@pytest.mark.parametrize("grouped", [False, "libpq", "psycopg"], ids=["alone", "libpq", "psycopg"])
def test_the_one_statement_write_refuses_a_stale_epoch_and_writes_nothing(
    pg_store: Any, grouped: str | bool
) -> None:
    db, append = Verbs(pg_store), appender(pg_store, grouped)
    info = owned(db)
    take_over(db, "wf-1", "ex-b")
    with pytest.raises(durably.FencedError, match="ex-b"):
        append("wf-1", info.epoch, [step(1)], NOW)
    assert db.load_history("wf-1") == []


@pytest.mark.parametrize("grouped", [False, "libpq", "psycopg"], ids=["alone", "libpq", "psycopg"])
def test_the_one_statement_write_refuses_a_parked_or_unknown_workflow(
    pg_store: Any, grouped: str | bool
) -> None:
    db, append = Verbs(pg_store), appender(pg_store, grouped)
    info = owned(db)
    sleep = journal.Entry(1, "sleep", "nap", "pending", 1, None, NOW, None, NOW + 60)
    assert db.park("wf-1", info.epoch, "sleeping", NOW + 60, [sleep], [], [], NOW)
    with pytest.raises(durably.FencedError, match="sleeping"):
        append("wf-1", info.epoch, [step(2)], NOW)
    with pytest.raises(errors.WorkflowNotFound):
        append("nope", 1, [step(1)], NOW)
    assert db.load_history("wf-1") == [sleep]


@pytest.mark.parametrize("grouped", [False, "libpq", "psycopg"], ids=["alone", "libpq", "psycopg"])
def test_the_one_statement_write_keeps_the_entry_rules(pg_store: Any, grouped: str | bool) -> None:
    """Idempotent repeat accepted, a final entry never replaced, progress resets crashes."""
    db, append = Verbs(pg_store), appender(pg_store, grouped)
    info = owned(db)
    append("wf-1", info.epoch, [step(1)], NOW)
    append("wf-1", info.epoch, [step(1)], NOW)  # the same again: accepted
    with pytest.raises(errors.StoreError, match="seq 1 already holds"):
        append("wf-1", info.epoch, [step(1, payload='"other"')], NOW)
    db.release("wf-1", info.epoch, NOW, True)  # the run died: a crash is counted
    later = NOW + 2 * LEASE
    claimed = db.claim_next("ex-b", [("refund", None)], later + LEASE, later, 1000)
    (again,) = [w for w in claimed if w.workflow_id == "wf-1"]  # (and the pals, grouped)
    assert again.crash_count == 1
    append("wf-1", again.epoch, [step(2, "running")], later)
    assert db.get_workflow("wf-1").crash_count == 1  # an intent is not progress
    append("wf-1", again.epoch, [step(2)], later)
    assert db.get_workflow("wf-1").crash_count == 0
    assert db.load_history("wf-1") == [step(1), step(2)]


def lock_waiters(url: str) -> tuple[int]:
    """How many sessions of the database wait for a lock now (seen from a new session: a
    transaction's view of pg_stat_activity is a snapshot)."""
    with psycopg.connect(url, autocommit=True) as observer:
        row = observer.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    assert row is not None
    return (int(row[0]),)


def test_a_write_waiting_on_a_claim_is_refused_once_the_claim_commits(
    pg_store: Any, postgres_url: str
) -> None:
    """The row lock of the one statement: a claim holding the row makes the write wait,
    and once it commits the write sees the new epoch and is fenced off."""
    db = Verbs(pg_store)
    info = owned(db)
    rival = psycopg.connect(postgres_url, autocommit=True)
    outcome: list[BaseException | None] = []
    try:
        rival.execute("SET search_path TO durably")
        rival.execute("BEGIN")
        rival.execute(
            "UPDATE workflows SET epoch = epoch + 1, owner = 'ex-b' WHERE workflow_id = 'wf-1'"
        )

        def write() -> None:
            try:
                db.append_entries("wf-1", info.epoch, [step(1)], NOW)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 30
        while True:
            (waiting,) = lock_waiters(postgres_url)
            if waiting:
                break
            assert writer.is_alive(), f"the write did not wait for the row lock: {outcome}"
            assert time.monotonic() < deadline, "the write never waited for the claim's row lock"
            time.sleep(0.01)
        rival.execute("COMMIT")
        writer.join(30)
        assert not writer.is_alive()
    finally:
        rival.close()
    assert len(outcome) == 1 and isinstance(outcome[0], durably.FencedError), outcome
    assert db.load_history("wf-1") == []


def test_a_one_statement_read_alone_is_one_round_trip(pg_store: Any) -> None:
    """A read marked ``one_read`` alone in its batch is its own transaction: the statement,
    no BEGIN and no COMMIT; every marked verb really sends one statement."""
    db = Verbs(pg_store)
    info = owned(db)
    db.append_entries("wf-1", info.epoch, [step(1)], NOW)
    reads: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (pg_store.get_workflow, ("wf-1",)),
        (pg_store.load_history, ("wf-1",)),
        (pg_store.history_page, ("wf-1", None, None, 10)),
        (pg_store.history_page, ("wf-1", 0, None, 10)),
        (pg_store.history_steps, ("wf-1", "ge")),
        (pg_store.history_mark, ("wf-1",)),
        (pg_store.live_events, ("approvals:pending", 10)),
        (pg_store.signals_page, ("wf-1", None, 10)),
        (pg_store.signals_page, ("wf-1", 5, 10)),
        (pg_store.next_wake, ()),
        (pg_store.list_executors, ()),
        (pg_store.list_workflows, (None, None, 10)),
        (pg_store.count_by_status, ()),
        (pg_store.count_unfinished, ()),
        (pg_store.unclaimed, (NOW, 10)),
        (pg_store.load_claims, ("wf-1",)),
        (pg_store.get_event, ("wf-1", "k")),
    ]
    marked = {
        name
        for name in dir(pg_store)
        if not name.startswith("_") and marks.is_one_read(getattr(pg_store, name))
    }
    assert marked == {fn.__name__ for fn, _ in reads}  # a new mark gets a check here
    for fn, args in reads:
        op = base.Op(fn, args, write=False)
        sent = traced(pg_store, [op])
        assert op.error is None, (fn.__name__, op.error)
        assert len(sent) == 1, (fn.__name__, sent)  # the read, nothing else
        assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert [e.seq for e in db.load_history("wf-1")] == [1]
    # Batched with another read, it is inside the batch's transaction as before.
    ops = [base.Op(pg_store.get_workflow, ("wf-1",), False) for _ in range(2)]
    sent = traced(pg_store, ops)
    assert [op.result.workflow_id for op in ops] == ["wf-1", "wf-1"]
    assert len(sent) == 3 and sent[-1].strip('" ') == "COMMIT", sent


def test_a_signal_sent_alone_is_one_round_trip(pg_store: Any) -> None:
    """send_signal alone in its batch is one statement (keep_signal): the number, the
    signal, the wake of its waiting workflow and the notification, no BEGIN, no COMMIT;
    what it refuses it still refuses, and several signals at once stay all or none."""
    db = Verbs(pg_store)
    owned(db, "a")
    parked_waiting(pg_store, "a")  # waiting for a signal
    op = base.Op(pg_store.send_signal, ("a", "go", '"1"', "k1", NOW), True)
    sent = traced(pg_store, [op])
    assert op.error is None and op.result is True
    assert len(sent) == 1, sent
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    row = db.get_workflow("a")
    assert row.wake_at == NOW  # due now: a claimer takes it
    again = base.Op(pg_store.send_signal, ("a", "go", '"2"', "k1", NOW), True)
    assert len(traced(pg_store, [again])) == 1 and again.result is False  # the key was used
    assert [(s["name"], s["payload"]) for s in db.list_signals("a")] == [("go", '"1"')]
    missing = base.Op(pg_store.send_signal, ("nope", "go", "1", None, NOW), True)
    traced(pg_store, [missing])
    assert isinstance(missing.error, errors.WorkflowNotFound)
    owned(db, "b")
    db.finish_workflow("b", 1, "completed", "1", None, [], NOW)
    ended = base.Op(pg_store.send_signal, ("b", "go", "1", None, NOW), True)
    traced(pg_store, [ended])
    assert isinstance(ended.error, errors.WorkflowFinished) and "completed" in str(ended.error)
    assert db.list_signals("b") == []
    # Two signals, the second to an ended workflow: neither is kept.
    pair = [("a", "x", "1", None), ("b", "x", "1", None)]
    both = base.Op(pg_store.send_signals, (pair, NOW), True)
    sent = traced(pg_store, [both])
    assert isinstance(both.error, errors.WorkflowFinished)
    assert [s["name"] for s in db.list_signals("a")] == ["go"], sent


def test_senders_of_one_key_at_once_keep_one_signal(postgres_url: str) -> None:
    """Two connections send the same key to one workflow at the same moment, many times:
    exactly one signal is kept each time and exactly one sender is told it was."""
    stores = [create_store(postgres_url) for _ in range(2)]
    for s in stores:
        s.open()
    try:
        db = Verbs(stores[0])
        owned(db, "a")
        for round_ in range(20):
            key = f"k{round_}"
            results: list[Any] = [None, None]
            barrier = threading.Barrier(2)

            def send(
                i: int, key: str = key, barrier: threading.Barrier = barrier, results=results
            ) -> None:
                barrier.wait()
                op = base.Op(stores[i].send_signal, ("a", "go", str(i), key, NOW), True)
                stores[i].run_batch([op])
                results[i] = op.error or op.result

            threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == [False, True], results
        kept = db.list_signals("a")
        assert len(kept) == 20 and len({s["idempotency_key"] for s in kept}) == 20
    finally:
        for s in stores:
            s.close()


def test_a_function_that_calls_verbs_keeps_its_transaction(pg_store: Any) -> None:
    """Only a verb called as itself is sent without BEGIN: a function that calls the
    one-statement verbs and then fails commits none of them."""
    db = Verbs(pg_store)
    info = owned(db)

    def write_then_fail() -> None:
        pg_store.append_entries("wf-1", info.epoch, [step(1)], NOW)
        pg_store.send_signal("wf-1", "go", "1", None, NOW)
        raise RuntimeError("after the writes")

    op = base.Op(write_then_fail, (), True)
    sent = traced(pg_store, [op])
    assert isinstance(op.error, RuntimeError)
    assert "ROLLBACK" in [s.strip('" ') for s in sent], sent
    assert db.load_history("wf-1") == [] and db.list_signals("wf-1") == []


def test_receiving_a_signal_there_is_one_round_trip(pg_store: Any) -> None:
    """The fence, the wait's settled entry, the signal, its consumption and the wait's
    entry in one statement, sent alone: one round trip, no BEGIN, no COMMIT. With no
    signal yet, the wait is written as it is after that statement. Sent again (its first
    outcome unknown), it returns the same entry and consumes nothing more."""
    db = Verbs(pg_store)
    info = owned(db)
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
    nothing, sent = statements(pg_store, pg_store.receive_signal, "wf-1", info.epoch, wait, [], NOW)
    assert nothing == wait and len(sent) == 2, sent  # nothing yet: the wait as it was
    assert db.load_history("wf-1") == [wait]
    db.send_signal("wf-1", "go", '"one"', None, NOW)
    db.send_signal("wf-1", "go", '"two"', None, NOW)
    got, sent = statements(pg_store, pg_store.receive_signal, "wf-1", info.epoch, wait, [], NOW)
    assert (got.status, got.payload, got.finished_at) == ("completed", '"one"', NOW)
    assert pg_store.last_round_trips == 1, sent
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    again, _ = statements(pg_store, pg_store.receive_signal, "wf-1", info.epoch, wait, [], NOW)
    assert again == got
    assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [1, None]
    assert db.load_history("wf-1") == [got]
    take_over(db, "wf-1", "ex-b")
    op = base.Op(pg_store.receive_signal, ("wf-1", info.epoch, wait, [], NOW), True)
    traced(pg_store, [op])
    assert isinstance(op.error, errors.FencedError)


def test_a_signal_received_in_one_statement_keeps_the_entry_rules(pg_store: Any) -> None:
    """The one-statement receive writes what the generic one writes: a new final entry
    ends the crashes counted in a row; another call's entry at the wait's seq is refused
    and the signal is left for a wait that can take it; a wait whose deadline passed with
    no signal times out; entries given with the wait are written too."""
    db = Verbs(pg_store)
    info = owned(db)
    with pg_store.conn.transaction():
        pg_store.conn.execute("UPDATE workflows SET crash_count = 2 WHERE workflow_id = 'wf-1'")
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
    db.send_signal("wf-1", "go", '"one"', None, NOW)
    got = db.receive_signal("wf-1", info.epoch, wait, [], NOW)
    assert got.status == "completed" and db.get_workflow("wf-1").crash_count == 0
    db.append_entries("wf-1", info.epoch, [step(2, "started")], NOW)  # a step's intent
    db.send_signal("wf-1", "go", '"two"', None, NOW)
    other = journal.Entry(2, "signal", "go", "started", 1, None, NOW, None, None)
    with pytest.raises(errors.StoreError, match="seq 2 already holds"):
        db.receive_signal("wf-1", info.epoch, other, [], NOW)
    assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [1, None]
    late = journal.Entry(3, "signal", "late", "started", 1, None, NOW, None, NOW + 5)
    timed_out = db.receive_signal("wf-1", info.epoch, late, [], NOW + 6)
    assert (timed_out.status, timed_out.finished_at) == ("timed_out", NOW + 6)
    staged = journal.Entry(4, "now", "now", "completed", 1, "1.0", NOW, NOW, None)
    wait5 = journal.Entry(5, "signal", "go", "started", 1, None, NOW, None, None)
    got5 = db.receive_signal("wf-1", info.epoch, wait5, [staged], NOW)
    assert (got5.status, got5.payload) == ("completed", '"two"')
    assert [e.seq for e in db.load_history("wf-1")] == [1, 2, 3, 4, 5]


def test_a_receive_that_found_no_signal_writes_the_wait_under_a_fence(
    pg_store: Any, postgres_url: str
) -> None:
    """The one-statement receive, sent alone, finds no signal and lets its row lock go;
    another executor then takes the workflow over and a signal is sent to it. The wait's
    timed-out entry the first executor writes next is fenced off, and the new owner
    receives the signal (a review found this write unfenced)."""
    other = create_store(postgres_url)
    other.open()
    try:
        db, theirs = Verbs(pg_store), Verbs(other)
        info = owned(db)
        wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, NOW + 5)
        db.append_entries("wf-1", info.epoch, [wait], NOW)
        receive = pg_store._queries["fence_and_receive_signal"]
        real = pg_store._execute
        later = NOW + 2 * LEASE

        def then_taken_over(sql_text: str, params: Any = None) -> Any:
            cursor = real(sql_text, params)
            if sql_text is receive:  # between the statement and the write that follows
                assert claim_next(theirs, "ex-b", later) == ["wf-1"]
                theirs.send_signal("wf-1", "go", '"hi"', None, later)
            return cursor

        pg_store._execute = then_taken_over
        try:
            with pytest.raises(errors.FencedError):
                db.receive_signal("wf-1", info.epoch, wait, [], NOW + 6)
        finally:
            del pg_store._execute
        row = theirs.get_workflow("wf-1")
        assert (row.owner, row.epoch) == ("ex-b", info.epoch + 1)
        assert theirs.load_history("wf-1") == [wait]  # nothing of the stale epoch's
        got = theirs.receive_signal("wf-1", row.epoch, wait, [], later)
        assert (got.status, got.payload) == ("completed", '"hi"')
    finally:
        other.close()


def claimer(owner: str = "ex-b") -> Any:
    from durably import operations

    return operations.Claimer(owner, list(RUNNABLE), LEASE, {})


def parked_on_signal(db: Verbs, wid: str) -> journal.Entry:
    """An owned workflow parked (waiting) on a signal wait at seq 1; the wait."""
    info = owned(db, wid)
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
    db.park(wid, info.epoch, "waiting", None, [wait], ["go"], [], NOW)
    return wait


def test_a_signal_and_the_claim_of_the_parked_workflow_it_wakes_are_one_round_trip(
    pg_store: Any,
) -> None:
    """The sender's commit that takes the workflow it wakes: BEGIN, the signal, the claim,
    the receive of the wait found on the server, the journal's read and COMMIT, in one
    pipeline (``pg_wakeup``). What it leaves is what the statements one at a time leave."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")  # the first claim on a connection writes its runnable set
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    parked_on_signal(db, "a")
    op = base.Op(
        operations._send_and_claim, (pg_store, "a", "go", '"x"', "k", NOW, claimer()), True
    )
    sent = traced(pg_store, [op])
    assert op.error is None, op.error
    woken = op.result
    assert len(sent) == 1, sent
    assert sent[-1].strip('" ') == "COMMIT", sent  # all went in one pipeline with COMMIT
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert woken.sent and woken.taken is not None and woken.taken.owner == "ex-b"
    assert woken.received is not None and woken.received.payload == '"x"'
    assert woken.history == db.load_history("a") == [woken.received]
    assert [s["consumed_seq"] for s in db.list_signals("a")] == [1]
    assert db.get_workflow("a").status == "running"


def test_a_signal_and_the_claim_it_makes_write_the_workflows_row_once(pg_store: Any) -> None:
    """The one round trip's signal and claim are one statement (keep_and_claim_signal)
    that updates the workflow's row once: each update of it changes an indexed column,
    so each writes a new entry in every index it is in. It returns what keep_signal
    returns, then the row as the claim left it."""
    from durably.storage import claims

    conn = pg_store.conn
    db = Verbs(pg_store)
    parked_on_signal(db, "once")
    keep = pg_store._keep_signal_params("once", "go", '"x"', None, NOW, False)
    for unused in ("channel", "wakeup", "tell"):
        del keep[unused]
    claim = pg_statements.claim_woken_params("ex-b", "once", NOW + LEASE, NOW)
    updates = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'workflows'::regclass"
    with conn.transaction(force_rollback=True):
        pg_store._fill_runnable(claims.runnable_rows(RUNNABLE, None))
        before = conn.execute(updates).fetchone()[0]
        cursor = conn.execute(pg_store._queries["keep_and_claim_signal"], {**claim, **keep})
        columns = [c.name for c in cursor.description][4:]
        row = dict(zip(columns, cursor.fetchone()[4:], strict=True))
        assert conn.execute(updates).fetchone()[0] - before == 1
        assert conn.execute(
            "SELECT num, consumed_seq FROM signals WHERE workflow_id = 'once'"
        ).fetchall() == [(1, None)]
        assert conn.execute(
            "SELECT epoch, owner, reason FROM claims WHERE workflow_id = 'once' ORDER BY epoch"
        ).fetchall()[-1] == (row["epoch"], "ex-b", "resume")
    assert (row["workflow_id"], row["status"], row["owner"]) == ("once", "running", "ex-b")
    assert db.get_workflow("once").status == "waiting"  # rolled back


def test_a_signal_whose_claim_takes_nothing_is_still_kept_and_told(pg_store: Any) -> None:
    """A signal to a workflow running elsewhere (nothing to claim), a duplicate key and a
    parked workflow asked to stop: each gives what the statements one at a time give."""
    from durably import operations

    db = Verbs(pg_store)
    owned(db, "busy")  # running, owned by ex-a: not claimable
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    listener = psycopg.connect(pg_store.conn.info.dsn, autocommit=True)
    try:
        listener.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(pg_store.channel)))
        args = (pg_store, "busy", "go", '"x"', "k1", NOW, claimer())
        woken = db.run(operations._send_and_claim, *args)
        assert woken.sent and woken.taken is None
        heard = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        assert heard and "busy" in heard[0]
    finally:
        listener.close()
    assert db.run(operations._send_and_claim, *args) == operations.Woken(False)  # the key
    assert [s["payload"] for s in db.list_signals("busy")] == ['"x"']
    assert db.get_workflow("busy").owner == "ex-a"
    parked_on_signal(db, "asked")
    db.request_cancel("asked", NOW)
    woken = db.run(operations._send_and_claim, pg_store, "asked", "go", '"y"', None, NOW,
                   claimer())  # fmt: skip
    assert woken.taken is not None and woken.received is None
    assert [s["consumed_seq"] for s in db.list_signals("asked")] == [None]
    # An unknown workflow: the op's own error, raised once (not run again), nothing kept.
    op = base.Op(
        operations._send_and_claim, (pg_store, "nope", "go", "1", None, NOW, claimer()), True
    )
    sent = traced(pg_store, [op])
    assert isinstance(op.error, errors.WorkflowNotFound), op.error
    # the pipeline (one round trip), which kept nothing: no ROLLBACK, no DEALLOCATE ALL
    assert len(sent) == 1, sent
    assert db.list_signals("nope") == []
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_wake_up_receives_only_into_a_workflow_its_own_claim_took(pg_store: Any) -> None:
    """The one round trip receives a signal only where this transaction's claim took the
    workflow, whatever the row's owner and lease say: a workflow this engine already runs,
    holding its signal wait in memory, with the very owner and lease this claim would set
    (one clock reading for both, as a frozen test clock gives), is left to its run: the
    claim takes nothing, the wait stays open and the signal unconsumed for the run to
    receive, as the verbs one by one leave it."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")  # the first claim on a connection writes its runnable set
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    info = owned(db, "held", owner="ex-b")  # running here, lease NOW + LEASE: the claim's
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
    db.append_entries("held", info.epoch, [wait], NOW)  # held in memory, not parked
    op = base.Op(
        operations._send_and_claim, (pg_store, "held", "go", '"x"', None, NOW, claimer()), True
    )
    sent = traced(pg_store, [op])
    assert op.error is None, op.error
    assert len(sent) == 1, sent  # the one round trip answered (not the verbs one by one)
    assert op.result.sent and op.result.taken is None
    assert db.load_history("held") == [wait]  # the run's wait, still open
    assert [s["consumed_seq"] for s in db.list_signals("held")] == [None]
    assert db.get_workflow("held").epoch == info.epoch


def test_a_woken_workflows_claim_and_journal_are_one_round_trip(pg_store: Any) -> None:
    """The recovery loop's direct claim of a workflow woken by another process's signal:
    BEGIN, the claim, the receive, the journal's read and COMMIT in one round trip, and
    no wake-up told (no signal was sent here)."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.send_signal("warm", "go", '"w"', None, NOW)
    db.run(operations.take_woken, pg_store, "warm", NOW, claimer())
    parked_on_signal(db, "a")
    db.send_signal("a", "go", '"x"', None, NOW)
    op = base.Op(operations.take_woken, (pg_store, "a", NOW, claimer()), True)
    sent = traced(pg_store, [op])
    assert op.error is None, op.error
    assert len(sent) == 1 and sent[-1].strip('" ') == "COMMIT", sent
    assert op.result.taken is not None and op.result.received.payload == '"x"'
    assert op.result.history == db.load_history("a") == [op.result.received]
    assert [s["consumed_seq"] for s in db.list_signals("a")] == [1]
    parked_on_signal(db, "b")  # nothing sent to it: the claim takes nothing
    listener = psycopg.connect(pg_store.conn.info.dsn, autocommit=True)
    try:
        listener.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(pg_store.channel)))
        nothing = db.run(operations.take_woken, pg_store, "b", NOW, claimer())
        assert not list(listener.notifies(timeout=0.3, stop_after=1))
    finally:
        listener.close()
    assert nothing.taken is None and db.get_workflow("b").status == "waiting"


def test_a_wake_up_whose_receive_finds_nothing_writes_nothing_after_its_commit(
    pg_store: Any,
) -> None:
    """A signal of another name wakes the parked workflow: the claim takes it, the
    receive (in the same pipeline as COMMIT) finds nothing, and nothing more is sent: the
    wait is left as it was, for the run to receive at its wait."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    wait = parked_on_signal(db, "a")
    op = base.Op(
        operations._send_and_claim, (pg_store, "a", "other", '"x"', None, NOW, claimer()), True
    )
    sent = traced(pg_store, [op])
    assert op.error is None, op.error
    assert len(sent) == 1 and sent[-1].strip('" ') == "COMMIT", sent
    woken = op.result
    assert woken.taken is not None and woken.received is None and woken.history == [wait]
    assert db.load_history("a") == [wait]
    assert [(s["name"], s["consumed_seq"]) for s in db.list_signals("a")] == [("other", None)]
    assert db.get_workflow("a").owner == "ex-b"


def _wake_ups(db: Verbs, store: Any, prefix: str, via: str) -> dict[str, tuple[Any, ...]]:
    """Each case of a signal's wake-up on workflows named ``prefix``-case, ``via`` the
    sender's ``_send_and_claim`` or, after a plain ``send_signal``, ``take_woken``: what
    it answered and what the database holds after it."""
    from durably import operations

    def parked(wid: str, entries: list[journal.Entry], *, timeout: float | None = None) -> None:
        info, created = db.create_workflow(
            dataclasses.replace(new(wid), timeout=timeout), "ex-a", NOW + LEASE, NOW
        )
        assert created
        db.park(wid, info.epoch, "waiting", None, entries, ["go"], [], NOW)

    wait = journal.Entry(2, "signal", "go", "started", 1, None, NOW, None, None)
    cases = {
        "alone": [dataclasses.replace(wait, seq=1)],
        "after-steps": [step(1), wait],
        "open-intent": [step(1, "started"), wait],  # a step's intent still open
        "sleep-last": [
            dataclasses.replace(wait, seq=1),
            journal.Entry(2, "sleep", "s", "started", 1, None, NOW, None, NOW + 60),
        ],
        "deadline": [dataclasses.replace(wait, seq=1)],
        "cancel": [dataclasses.replace(wait, seq=1)],
    }
    found: dict[str, tuple[Any, ...]] = {}
    for case, entries in cases.items():
        wid = f"{prefix}-{case}"
        parked(wid, entries, timeout=0.5 if case == "deadline" else None)
        if case == "cancel":
            db.request_cancel(wid, NOW)
        at = NOW + 1  # past the deadline's half second
        if via == "send":
            woken = db.run(operations._send_and_claim, store, wid, "go", '"x"', None, at, claimer())
        else:
            assert db.send_signal(wid, "go", '"x"', None, at)
            woken = db.run(operations.take_woken, store, wid, at, claimer())
        taken = None if woken.taken is None else (woken.taken.status, woken.taken.owner)
        row = db.get_workflow(wid)
        found[case] = (
            woken.sent,
            taken,
            woken.history,
            woken.received,
            db.load_history(wid),
            [(s["payload"], s["consumed_seq"]) for s in db.list_signals(wid)],
            (row.status, row.owner, row.epoch, row.crash_count),
        )
    return found


def test_a_wake_up_in_one_round_trip_does_what_the_verbs_one_by_one_do(
    pg_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server finds the parked wait as ``replay.parked_signal_wait`` finds it and
    receives only where the claim took the workflow and nothing asks it to stop: in
    every case the one round trip answers and leaves what the verbs one by one (psycopg
    sending, nothing prepared: ``pg_wakeup`` declines) answer and leave."""
    db = Verbs(pg_store)
    parked_on_signal(db, "warm")  # the connection's runnable set, written by a claim
    from durably import operations

    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    committed: list[bool] = []  # each transaction() call: whether it sent all at once
    real = pg_direct.Direct.transaction

    def transaction(self: pg_direct.Direct, statements: Any) -> Any:
        results = real(self, statements)
        committed.append(results is not None)
        return results

    monkeypatch.setattr(pg_direct.Direct, "transaction", transaction)
    at_once = {via: _wake_ups(db, pg_store, f"one-{via}", via) for via in ("send", "take")}
    assert committed == [True] * 12  # one round trip each
    monkeypatch.setattr(pg_direct, "PREPARED_MAX", 0)  # Direct declines: verb by verb
    one_by_one = {via: _wake_ups(db, pg_store, f"many-{via}", via) for via in ("send", "take")}
    assert committed[12:] == [False] * 12
    assert at_once == one_by_one
    at_once = at_once["send"]
    assert at_once["alone"][3] is not None and at_once["after-steps"][3] is not None
    for case in ("open-intent", "sleep-last", "deadline", "cancel"):
        assert at_once[case][1] is not None and at_once[case][3] is None, case


def test_a_duplicate_signal_takes_a_workflow_that_was_due_and_tells_no_one(
    pg_store: Any,
) -> None:
    """A signal whose key was used before keeps nothing and sends no wake-up; where its
    workflow was due anyway (the first signal woke it, nobody took it yet), the one
    round trip takes it, receiving that first signal, and the engine runs it."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    parked_on_signal(db, "due")
    assert db.send_signal("due", "go", '"first"', "k", NOW)  # due now, not taken
    listener = psycopg.connect(pg_store.conn.info.dsn, autocommit=True)
    try:
        listener.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(pg_store.channel)))
        args = (pg_store, "due", "go", '"again"', "k", NOW, claimer())
        woken = db.run(operations._send_and_claim, *args)
        assert not woken.sent and woken.taken is not None and woken.taken.owner == "ex-b"
        assert woken.received is not None and woken.received.payload == '"first"'
        assert not list(listener.notifies(timeout=0.3, stop_after=1))
    finally:
        listener.close()
    assert [(s["payload"], s["consumed_seq"]) for s in db.list_signals("due")] == [('"first"', 1)]


def test_a_wake_up_on_a_connection_the_server_closed_while_idle_connects_again(
    pg_store: Any, postgres_url: str
) -> None:
    """A connection the server ended while it sat idle (a restart, an idle timeout) is
    seen before the one round trip is sent: the wake-up goes verb by verb on a new
    connection, as any batch's first statement does, and the signal is kept once."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    parked_on_signal(db, "a")
    before = pg_store.conn.info.backend_pid
    url, _ = postgres.split_schema(postgres_url)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (before,))
    time.sleep(0.2)  # its FATAL message is on the socket
    woken = db.run(operations._send_and_claim, pg_store, "a", "go", '"x"', None, NOW, claimer())
    assert pg_store.conn.info.backend_pid != before  # connected again
    assert woken.sent and woken.taken is not None and woken.received is not None
    assert [(s["payload"], s["consumed_seq"]) for s in db.list_signals("a")] == [('"x"', 1)]


def test_a_signal_sent_alone_whose_answer_is_lost_is_not_sent_again(
    pg_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal without a key is not sent as a transaction of its own: sent so, it would
    commit on the server, and were the connection lost before its answer was read, the
    statement would be sent again on a new connection and keep the signal twice. With
    BEGIN, the loss of its COMMIT's answer leaves the outcome unknown: the call fails
    with DatabaseUnavailable, the signal kept once. The next call reconnects."""
    db = Verbs(pg_store)
    owned(db, "a")
    db.send_signal("a", "warm", '"0"', None, NOW)  # keep_signal is prepared on the connection
    real = psycopg.generators.execute
    cut = [True]

    def lose_the_answer(pgconn: Any) -> Any:
        results = yield from real(pgconn)  # the server ran it and committed
        if cut[0]:
            cut[0] = False
            pgconn.finish()  # as a network cut would, before this answer was read
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return results

    monkeypatch.setattr(psycopg.generators, "execute", lose_the_answer)
    op = base.Op(pg_store.send_signal, ("a", "go", '"1"', None, NOW), True)
    pg_store.run_batch([op])
    monkeypatch.undo()
    assert [s["name"] for s in db.list_signals("a")] == ["warm", "go"]  # once, not twice
    assert isinstance(op.error, errors.DatabaseUnavailable), op.error
    db.send_signal("a", "next", '"2"', None, NOW)  # connected again
    assert [s["name"] for s in db.list_signals("a")] == ["warm", "go", "next"]


def test_a_last_statement_that_fails_with_its_commit_leaves_nothing_committed(
    pg_store: Any, postgres_url: str
) -> None:
    """The receive and COMMIT go in one pipeline: when the receive fails (here a lock it
    waits for past lock_timeout), the COMMIT is not applied. The signal, the claim and
    the receive are all undone, and the op fails with the error."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    wait = parked_on_signal(db, "a")
    holder = psycopg.connect(postgres_url)  # the wait's journal row, locked elsewhere
    try:
        holder.execute(
            pgsql.SQL("SELECT * FROM {}.journal WHERE workflow_id = 'a' FOR UPDATE").format(
                pgsql.Identifier(pg_store.schema)
            )
        )
        pg_store.conn.execute("SET lock_timeout = '200ms'")
        op = base.Op(
            operations._send_and_claim, (pg_store, "a", "go", '"x"', None, NOW, claimer()), True
        )
        sent = traced(pg_store, [op])
    finally:
        holder.close()
        pg_store.conn.execute("RESET lock_timeout")
    assert isinstance(op.error, errors.StoreError), op.error
    assert "lock" in str(op.error), op.error
    assert "ROLLBACK" in [s.strip('" ') for s in sent], sent
    assert pg_store.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert db.list_signals("a") == [] and db.load_history("a") == [wait]
    row = db.get_workflow("a")
    assert (row.status, row.owner) == ("waiting", None)


def test_a_wait_whose_deadline_passed_is_left_to_the_run_by_the_wake_up(
    pg_store: Any,
) -> None:
    """A signal of another name wakes a wait whose deadline has passed: the receive sent
    with COMMIT times nothing out (it writes nothing it did not receive); the journal
    keeps the wait started, and the run's own receive times it out."""
    from durably import operations

    db = Verbs(pg_store)
    info = owned(db, "t")
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, NOW + 1)
    db.park("t", info.epoch, "waiting", NOW + 1, [wait], ["go"], [], NOW)
    args = (pg_store, "t", "other", '"x"', None, NOW + 5, claimer())
    woken = db.run(operations._send_and_claim, *args)
    assert woken.taken is not None and woken.received is None
    assert db.load_history("t") == [wait]
    got = db.receive_signal("t", woken.taken.epoch, wait, [], NOW + 6)
    assert (got.status, got.finished_at) == ("timed_out", NOW + 6)
    assert db.load_history("t") == [got]


def test_an_inline_wake_up_whose_receive_waits_for_a_lock_runs_again_once(
    pg_store: Any, postgres_url: str
) -> None:
    """On the event loop's own connection a receive that waits for a lock gives up (the
    loop never waits): nothing of the op is committed, and run again on a store thread
    it keeps one signal, received once."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    wait = parked_on_signal(db, "a")
    pg_store._inline_wanted = True
    pg_store._open_inline()
    warm = (pg_store, "warm", "go", '"w"', None, NOW, claimer())
    assert pg_store.run_inline(base.Op(operations._send_and_claim, warm, True))
    holder = psycopg.connect(postgres_url)  # the wait's journal row, locked elsewhere
    try:
        holder.execute(
            pgsql.SQL("SELECT * FROM {}.journal WHERE workflow_id = 'a' FOR UPDATE").format(
                pgsql.Identifier(pg_store.schema)
            )
        )
        args = (pg_store, "a", "go", '"x"', None, NOW, claimer())
        op = base.Op(operations._send_and_claim, args, True)
        assert pg_store.run_inline(op) is False and op.error is None  # left to a thread
        inline = pg_store._inline.conn.info.transaction_status
        assert inline == psycopg.pq.TransactionStatus.IDLE
    finally:
        holder.close()
    assert db.list_signals("a") == [] and db.load_history("a") == [wait]
    woken = db.run(operations._send_and_claim, *args)
    assert woken.received is not None and woken.received.payload == '"x"'
    assert [s["consumed_seq"] for s in db.list_signals("a")] == [1]
    session = pg_store._inline
    assert (session.ends_with, session.commit_with, session.ended) == (None, False, False)


def test_a_statement_after_the_promised_last_one_is_refused(pg_store: Any) -> None:
    """An op that promised its last verb (``ends_with``) and sends a statement after it
    fails with a StoreError that says so, instead of sending it outside its transaction."""
    db = Verbs(pg_store)
    info = owned(db)
    wait = journal.Entry(1, "signal", "go", "started", 1, None, NOW, None, None)
    db.send_signal("wf-1", "go", '"x"', None, NOW)

    @marks.ends_with("receive_parked_signal")
    def receive_then_read() -> Any:
        pg_store.append_entries("wf-1", info.epoch, [step(0)], NOW)
        got = pg_store.receive_parked_signal("wf-1", info.epoch, wait, NOW)
        assert got.status == "completed"
        return pg_store.get_workflow("wf-1")

    op = base.Op(receive_then_read, (), True)
    traced(pg_store, [op])
    assert isinstance(op.error, errors.StoreError), op.error
    assert "transaction was committed, then it failed" in str(op.error)
    assert "last statement it promised (receive_parked_signal)" in str(op.error)
    # what went with COMMIT is committed: the entry before it, the receive
    assert [e.seq for e in db.load_history("wf-1")] == [0, 1]
    assert [s["consumed_seq"] for s in db.list_signals("wf-1")] == [1]


# --- claims: a recovery pass ---------------------------------------------------------------


def runnable_statements(sent: list[str]) -> list[str]:
    """The statements that (re)write the runnable table, not the claims that read it. (A
    statement without parameters is traced as a Query of its first line only: its comment.)"""
    writes = ("CREATE TEMPORARY TABLE", "Empty the runnable_here", "INSERT INTO runnable_here")
    return [s for s in sent if any(w in s for w in writes)]


def claim(store: Any, owner: str = "ex-a", limit: int = 100) -> tuple[list[str], list[str]]:
    """One claim_next of the test suite's runnable set, as one batch: (the ids taken, every
    statement sent, BEGIN and COMMIT included)."""
    op = base.Op(store.claim_next, (owner, RUNNABLE, NOW + LEASE, NOW, limit), True)
    sent = traced(store, [op])
    if op.error is not None:
        raise op.error
    return [w.workflow_id for w in op.result], sent


def test_a_claim_pass_with_the_same_runnable_set_does_not_write_it_again(pg_store: Any) -> None:
    _, first = claim(pg_store)
    assert len(runnable_statements(first)) == 2 + len(RUNNABLE), first  # create, clear, adds
    Verbs(pg_store).create_workflow(new("a"), None, None, NOW)
    taken, again = claim(pg_store)
    assert taken == ["a"]
    assert runnable_statements(again) == [], again
    other = base.Op(pg_store.claim_next, ("ex-a", [("refund", "2")], NOW + LEASE, NOW, 9), True)
    assert len(runnable_statements(traced(pg_store, [other]))) == 3  # another set: written


@pytest.mark.parametrize("n", [1, 100])
def test_a_pass_claiming_n_unqueued_workflows_is_two_round_trips(pg_store: Any, n: int) -> None:
    """The runnable set unchanged, a pass is BEGIN pipelined with one statement that picks
    and claims every row (and records why), then COMMIT: two waits whatever n is (it was
    3n + 6 with two runnable pairs: the table refilled, then a claim, its record and a read
    of the row for each)."""
    db = Verbs(pg_store)
    claim(pg_store)  # the runnable table: written once
    for i in range(n):
        db.create_workflow(new(f"p{i:03}"), None, None, NOW + i)
    taken, sent = claim(pg_store)
    assert taken == [f"p{i:03}" for i in range(n)]  # oldest first
    # (psycopg prepares BEGIN and COMMIT once sent five times: the trace then shows them
    # as a Bind of a name parsed before, counted here but under the last text parsed)
    assert len(sent) == 2 and "claimable_unqueued's pick" in sent[0], sent
    later = NOW + n + 2 * LEASE  # every lease ran out: each is recovered, a crash counted
    op = base.Op(pg_store.claim_next, ("ex-b", RUNNABLE, later + LEASE, later, n), True)
    assert len(traced(pg_store, [op])) == 2 and op.error is None
    assert [(w.workflow_id, w.owner, w.epoch, w.crash_count) for w in op.result] == [
        (f"p{i:03}", "ex-b", 2, 1) for i in range(n)
    ]
    for wid in ("p000", f"p{n - 1:03}"):
        assert [(c.epoch, c.owner, c.previous_owner, c.reason) for c in db.load_claims(wid)] == [
            (1, "ex-a", None, "start"),
            (2, "ex-b", "ex-a", "recovery"),
        ]
        assert db.load_claims(wid)[1].claimed_at == later


@pytest.mark.parametrize("n", [1, 3])
def test_a_queued_workflow_is_taken_in_one_statement(pg_store: Any, n: int) -> None:
    """A queue's pick (after its lock and its load) is followed by one statement per row
    taken: the claim, its record and the row read back, in one data-modifying WITH."""
    db = Verbs(pg_store)
    limits = base.QueueLimits("llm")
    db.claim_next("ex-a", RUNNABLE, NOW + LEASE, NOW, 100, [limits])  # table, queue row
    for i in range(n):
        queued(db, f"q{i}", "llm", NOW + i)
    op = base.Op(pg_store.claim_next, ("ex-a", RUNNABLE, NOW + LEASE, NOW, 100, [limits]), True)
    sent = traced(pg_store, [op])
    assert op.error is None
    assert [w.workflow_id for w in op.result] == [f"q{i}" for i in range(n)]
    assert [(w.owner, w.epoch, w.status) for w in op.result] == [("ex-a", 1, "running")] * n
    assert [c.reason for i in range(n) for c in db.load_claims(f"q{i}")] == ["start"] * n
    # BEGIN with the unqueued claim, the queue's lock, its load, its pick, n takes, COMMIT
    assert len(sent) == 5 + n, sent
    later = NOW + 2 * LEASE  # the leases ran out: recoveries, a crash counted each
    again = db.claim_next("ex-b", RUNNABLE, later + LEASE, later, 100, [limits])
    assert [(w.owner, w.epoch, w.crash_count) for w in again] == [("ex-b", 2, 1)] * n
    assert [c.reason for c in db.load_claims("q0")] == ["start", "recovery"]
    assert db.load_claims("q0")[1].previous_owner == "ex-a"


def test_after_a_rollback_the_runnable_set_is_written_again(pg_store: Any) -> None:
    """A batch that filled the table and failed is rolled back, the table's rows with it:
    the next pass writes them again (and finds its workflows: tests/test_store.py)."""
    claim(pg_store)
    op = base.Op(claim_then_fail, (pg_store, [("other", None)]), True)
    pg_store.run_batch([op])
    assert op.error is not None
    Verbs(pg_store).create_workflow(new("a"), None, None, NOW)
    taken, sent = claim(pg_store)
    assert taken == ["a"]
    assert len(runnable_statements(sent)) == 2 + len(RUNNABLE), sent


def terminate(url: str, pid: int) -> None:
    """End the server process of another session, as a server restart would, and wait
    until it is gone."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 30
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the session was not terminated"
            time.sleep(0.01)


def test_a_pass_that_reconnects_writes_the_runnable_table_on_the_new_connection(
    pg_store: Any, postgres_url: str
) -> None:
    """The connection was lost between two passes: the pass's first statement (the pick,
    the runnable table being known) finds it dead and is sent again on a new connection,
    which gets the table first."""
    claim(pg_store)
    Verbs(pg_store).create_workflow(new("a"), None, None, NOW)
    lost = pg_store.conn
    terminate(postgres_url, lost.info.backend_pid)
    assert claim_next(Verbs(pg_store), "ex-a") == ["a"]
    assert pg_store.conn is not lost
    Verbs(pg_store).create_workflow(new("b"), None, None, NOW)
    taken, sent = claim(pg_store)
    assert taken == ["b"] and runnable_statements(sent) == [], sent  # known again


@durably.step
async def plain(i: int) -> int:
    return i


@durably.workflow(name="round-trips.steps")
async def plain_steps(n: int) -> int:
    return sum([await plain(i) for i in range(n)])


async def _begins_sent(engine: durably.Engine, steps: int) -> int:
    """How many BEGINs every connection of the engine's store sent while a workflow of
    ``steps`` plain steps ran."""
    conns = list(engine._store.store._connections)
    files = []
    for conn in conns:
        fd, path = tempfile.mkstemp(suffix=".trace")
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        files.append((fd, path))
    try:
        assert await (await engine.start(plain_steps, steps)).result(timeout=30) == sum(
            range(steps)
        )
    finally:
        for conn in conns:
            conn.pgconn.untrace()
    begins = 0
    for fd, path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            begins += f.read().count("BEGIN")
        os.close(fd)
        os.unlink(path)
    return begins


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("keep_lease", "running"),
        ("cancel_unstarted", "pending"),
        ("dequeue", "pending"),
        ("review_decided", "needs_review"),
    ],
)
def test_a_one_workflow_update_finds_its_row_by_the_key_whatever_the_statistics_say(
    pg_store: Any, query: str, status: str
) -> None:
    """The updates of one workflow that also name its owner or status look the row up by
    the primary key, never through ``workflows_by_owner`` or ``workflows_by_status``:
    with the statistics taken while no workflow was owned or had that status (the
    fence's trap, above), PostgreSQL planned them as a scan of every workflow an
    executor owns, or of every one in that status. Here 5,000 such, analyzed before."""
    conn = pg_store.conn
    _five_thousand(conn, "completed", None)
    conn.execute("ANALYZE workflows")
    with conn.transaction():
        conn.execute(
            "UPDATE workflows SET status = %s, owner = 'ex-a' WHERE workflow_id LIKE 'old-%%'",
            (status,),
        )
    params = {"workflow_id": "old-7", "owner": "ex-a", "epoch": 1, "now": NOW,
              "lease_expires_at": NOW + LEASE, "error": "{}"}  # fmt: skip
    with conn.transaction(force_rollback=True):  # (EXPLAIN ANALYZE runs the write)
        explained = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + pg_store._queries[query], params)
        plan = "\n".join(row[0] for row in explained)
    assert "workflows_by_owner" not in plan and "workflows_by_status" not in plan, plan
    assert "Index Scan using workflows_pkey on workflows" in plan, plan


def test_a_debounced_start_reads_its_keys_workflows_not_every_pending_one(
    pg_store: Any,
) -> None:
    """A debounced start ends the earlier unstarted workflows of its queue and key through
    ``workflows_debounced``, not through ``workflows_by_status``: a burst leaves thousands
    pending, and statistics taken before it say none is. Here 5,000 of other keys."""
    conn = pg_store.conn
    with conn.transaction():
        conn.execute(
            "INSERT INTO workflows (workflow_id, name, status, input, epoch, queue, "
            "debounce_key, created_at, updated_at) SELECT 'old-' || n, 'refund', "
            "'completed', '[]', 0, 'q', 'k-' || n, %s, %s FROM generate_series(1, 5000) AS n",
            (NOW, NOW),
        )
    conn.execute("ANALYZE workflows")
    with conn.transaction():
        conn.execute("UPDATE workflows SET status = 'pending' WHERE workflow_id LIKE 'old-%%'")
    params = {"queue": "q", "debounce_key": "k-7", "workflow_id": "new", "now": NOW,
              "error": "{}"}  # fmt: skip
    with conn.transaction(force_rollback=True):  # (EXPLAIN ANALYZE runs the write)
        explained = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + pg_store._queries["supersede_debounced"], params
        )
        plan = "\n".join(row[0] for row in explained)
    assert "workflows_by_status" not in plan, plan
    assert "workflows_debounced" in plan, plan


@pytest.mark.parametrize("inline", [True, False])
async def test_an_engines_one_step_workflow_sends_no_begin(postgres_url: str, inline: bool) -> None:
    """Through a running engine, a 1-step workflow's start, step and finish are each
    one statement sent alone: ten of them, no BEGIN (a finish was BEGIN with its UPDATE,
    then COMMIT)."""
    async with durably.Engine(postgres_url, inline_commits=inline) as engine:
        for _ in range(6):  # every statement prepared, the connections open
            await _begins_sent(engine, 1)
        begins = [await _begins_sent(engine, 1) for _ in range(10)]
    assert sum(begins) <= 2, begins  # a recovery pass may run meanwhile; not one each


@pytest.mark.parametrize("inline", [True, False])
async def test_an_engines_plain_step_commits_without_begin(postgres_url: str, inline: bool) -> None:
    """Through a running engine too (on the store thread, or on the loop's own
    connection), a plain step's commit is sent alone: twenty more steps, no more BEGINs."""
    async with durably.Engine(postgres_url, inline_commits=inline) as engine:
        await _begins_sent(engine, 25)  # every statement prepared, the connections open
        few = await _begins_sent(engine, 5)
        many = await _begins_sent(engine, 25)
    assert many - few <= 2, (few, many)  # not one per step


def _five_thousand(conn: psycopg.Connection[Any], status: str, owner: str | None) -> None:
    """Workflows old-1 to old-5000 with this status and owner, in one statement."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO workflows (workflow_id, name, status, input, owner, epoch, "
            "created_at, updated_at) SELECT 'old-' || n, 'refund', %s, '[]', %s, 1, %s, "
            "%s FROM generate_series(1, 5000) AS n",
            (status, owner, NOW, NOW),
        )


def test_a_fence_finds_its_row_by_the_key_while_statistics_say_none_is_owned(
    pg_store: Any,
) -> None:
    """The fence looks its row up by the primary key alone, whatever the statistics say.

    With its terms in one WHERE, PostgreSQL planned it as a scan of the owned workflows'
    partial index (``workflows_by_owner``) whenever the last ANALYZE had found no owned
    workflow, reading every dead entry the claims and finishes since had left there: on
    the benchmark's database, 896 buffers and 2.5 ms for one step's commit (issue 12,
    sixteenth pass). Here: 5,000 workflows owned and let go, analyzed, then one owned."""
    conn = pg_store.conn
    _five_thousand(conn, "running", "ex-a")
    with conn.transaction():
        conn.execute("UPDATE workflows SET owner = NULL WHERE workflow_id LIKE 'old-%%'")
    conn.execute("ANALYZE workflows")
    db = Verbs(pg_store)
    info = owned(db)
    params = pg_statements.entries.entry_params("wf-1", step(1))
    for query, extra in (
        ("fence_and_write_entry", {"now": NOW, "epoch": info.epoch, **params}),
        ("fence", {"workflow_id": "wf-1", "epoch": info.epoch}),
    ):
        with conn.transaction(force_rollback=True):  # (EXPLAIN ANALYZE runs the write)
            explained = conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF) " + pg_store._queries[query], extra
            )
            plan = "\n".join(row[0] for row in explained)
        assert "workflows_by_owner" not in plan, plan
        assert "Index Scan using workflows_pkey on workflows" in plan, plan
    assert db.load_history("wf-1") == []  # the write EXPLAIN ANALYZE ran, rolled back


def test_a_wake_ups_receive_reads_its_workflow_by_key_and_only_the_open_entries(
    pg_store: Any,
) -> None:
    """The one-round-trip receive (``receive_taken_signal``) finds its workflow by the
    primary key, however many run (not through ``workflows_by_status``, all the running
    ones), and checks that the entries before the wait are final through the open
    entries' index (``journal_open``), not by reading every entry of a long journal.
    Here 5,000 workflows run elsewhere, analyzed, and the woken one has 2,000 steps."""
    from durably.storage import claims

    conn = pg_store.conn
    _five_thousand(conn, "running", "ex-a")
    db = Verbs(pg_store)
    info = owned(db, "long")
    db.append_entries("long", info.epoch, [step(n) for n in range(1, 2001)], NOW)
    wait = journal.Entry(2001, "signal", "go", "started", 1, None, NOW, None, None)
    db.park("long", info.epoch, "waiting", None, [wait], ["go"], [], NOW)
    db.send_signal("long", "go", '"x"', None, NOW)
    conn.execute("ANALYZE workflows")
    conn.execute("ANALYZE journal")
    claim = pg_statements.claim_woken_params("ex-b", "long", NOW + LEASE, NOW)
    with conn.transaction(force_rollback=True):  # (EXPLAIN ANALYZE runs the writes)
        pg_store._fill_runnable(claims.runnable_rows(RUNNABLE, None))
        taken = conn.execute(pg_store._queries["claim_woken"], claim).fetchall()
        assert len(taken) == 1 and taken[0][1] == "long", taken
        explained = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + pg_store._queries["receive_taken_signal"],
            {**claim, "channel": pg_store.channel, "wakeup": ""},
        )
        plan = "\n".join(row[0] for row in explained)
        received = conn.execute(
            "SELECT status FROM journal WHERE workflow_id = 'long' AND seq = 2001"
        ).fetchone()
        assert received == ("completed",), plan  # it received, in this transaction
    assert "workflows_by_status" not in plan, plan
    assert "Index Scan using workflows_pkey on workflows w" in plan, plan
    assert "journal_open" in plan, plan
    assert db.load_history("long")[-1] == wait  # EXPLAIN ANALYZE's writes, rolled back


def test_a_signal_whose_workflow_another_claims_meanwhile_is_kept_and_takes_nothing(
    pg_store: Any, postgres_url: str
) -> None:
    """Another executor claims the parked workflow after the one round trip's statement
    took its snapshot and before it locked the row: the statement waits for the row,
    then decides on the row as the claim left it (``FOR UPDATE`` in
    keep_and_claim_signal): the signal is kept and numbered, and nothing is taken from
    the executor that now runs it."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    parked_on_signal(db, "a")
    epoch = db.get_workflow("a").epoch
    with psycopg.connect(postgres_url, autocommit=True) as rival:
        rival.execute("SET search_path TO durably")
        rival.execute("BEGIN")
        rival.execute(
            "UPDATE workflows SET status = 'running', owner = 'ex-other', epoch = epoch + 1,"
            " lease_expires_at = %s WHERE workflow_id = 'a'",
            (NOW + LEASE,),
        )
        sent: dict[str, Any] = {}

        def send() -> None:
            sent["woken"] = db.run(
                operations._send_and_claim, pg_store, "a", "go", '"x"', None, NOW, claimer()
            )

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 30
        while lock_waiters(postgres_url) == (0,):  # the statement waits for the row
            assert time.monotonic() < deadline and sender.is_alive()
            time.sleep(0.01)
        rival.execute("COMMIT")
        sender.join(30)
    woken = sent["woken"]
    assert woken.sent and woken.taken is None
    row = db.get_workflow("a")
    assert (row.owner, row.status, row.epoch) == ("ex-other", "running", epoch + 1)
    assert [(x["num"], x["consumed_seq"]) for x in db.list_signals("a")] == [(1, None)]
    assert "ex-b" not in [c.owner for c in db.load_claims("a")]


def _slow_keep(pg_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_signal as it is, plus a pause at its end: a commit elsewhere lands between its
    snapshot and the claim's (the real window, wider; found by a second read). And
    keep_and_claim_signal (the one round trip's signal and claim in one statement) with a
    pause before it looks for the workflow's row: a commit elsewhere lands after the
    statement's snapshot, before its row lock."""
    row = "FROM workflows WHERE workflow_id = %(workflow_id)s"
    changes = {
        "keep_signal": [
            ("), woken AS (", "), slept AS (SELECT pg_sleep(0.6) AS z\n), woken AS ("),
            (row, row + " AND (SELECT z IS NULL OR true FROM slept)"),
        ],
        "keep_and_claim_signal": [
            (
                row + "\n    FOR UPDATE",
                "FROM workflows WHERE workflow_id = (SELECT %(workflow_id)s::text"
                " FROM (SELECT pg_sleep(0.6)) AS z)\n    FOR UPDATE",
            )
        ],
    }
    for query, replacements in changes.items():
        text = slow = pg_store._queries[query]
        for before, after in replacements:
            slow = slow.replace(before, after)
        assert slow != text
        monkeypatch.setitem(pg_store._queries, query, slow)


@pytest.mark.parametrize("verbs", [False, True], ids=["at-once", "verbs"])
def test_a_signal_refused_as_unknown_claims_nothing_created_meanwhile(
    pg_store: Any, postgres_url: str, monkeypatch: pytest.MonkeyPatch, verbs: bool
) -> None:
    """A signal to a workflow that did not exist when it was kept is refused, and the
    claim in its transaction takes nothing, even where the workflow was created by
    another transaction between the two statements: the one round trip took it and then
    raised, leaving it running under a lease and no run launched."""
    from durably import operations

    db = Verbs(pg_store)
    parked_on_signal(db, "warm")  # the connection's runnable set
    db.run(operations._send_and_claim, pg_store, "warm", "go", '"w"', None, NOW, claimer())
    _slow_keep(pg_store, monkeypatch)
    if verbs:
        monkeypatch.setattr(pg_direct, "PREPARED_MAX", 0)  # Direct declines: verb by verb
    other = create_store(postgres_url)
    other.open()
    try:

        def start() -> None:
            time.sleep(0.2)
            Verbs(other).create_workflow(new("late"), None, None, NOW)  # pending, unowned

        t = threading.Thread(target=start)
        t.start()
        with pytest.raises(errors.WorkflowNotFound):
            db.run(operations._send_and_claim, pg_store, "late", "go", '"x"', None, NOW,
                   claimer())  # fmt: skip
        t.join()
    finally:
        other.close()
    row = db.get_workflow("late")
    assert (row.status, row.owner, row.epoch) == ("pending", None, 0)
