"""Replays of workflows whose tasks ran at once (``asyncio.gather``, ``create_task``).

Branches of a gather finish in whatever order their steps do, so the first run
journals their calls interleaved. A replay returns recorded results at once, so
its branches call in another order: each call must still meet its own entry
(matched by the call its task made before it, ``Entry.follows``), never a
neighbour's. Counted on real SQLite files and a real SIGKILL: a call matched to
another branch's entry returns that branch's result, and the call whose entry
it took runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import durably
from tests.agentkit.live import until
from tests.crashkit.harness import journal_rows, killed_once_then_done, query, read_effects


def test_a_killed_gather_recovers_each_branch_with_its_own_entries(tmp_path: Path) -> None:
    wf, exits = killed_once_then_done(tmp_path, "gathered", "wf-gathered")
    assert exits[-1].output() == {
        "ok": True,
        "result": [["fetch:a", "charge:a"], ["fetch:b", "charge:b"]],
    }
    calls = [(e["args"][0], e["args"][1], e["seq"], e["pid"]) for e in read_effects(wf.effects)]
    # every call ran once, under the seq (so the idempotency key) the first run gave it;
    # only a's charge, on its way at the kill, ran in the second process
    assert sorted((op, name, seq) for op, name, seq, _ in calls) == [
        ("charge", "a", 4),
        ("charge", "b", 3),
        ("fetch", "a", 1),
        ("fetch", "b", 2),
    ]
    pids = {(op, name): pid for op, name, _, pid in calls}
    assert pids["fetch", "a"] == pids["fetch", "b"] == pids["charge", "b"] != pids["charge", "a"]
    rows = journal_rows(wf.db, wf.workflow_id)
    assert [(r["seq"], json.loads(r["payload"])) for r in rows] == [
        (1, "fetch:a"),
        (2, "fetch:b"),
        (3, "charge:b"),
        (4, "charge:a"),
    ]
    assert query(wf.db, "SELECT warnings FROM workflows") == [(None,)]


def test_steps_of_two_branches_cut_by_a_kill_run_again_under_their_own_keys(
    tmp_path: Path,
) -> None:
    """Both branches' sends were on their way at the SIGKILL, so neither has an entry to
    keep its seq by, and the recovery calls them in the other order. Each must run
    again under the idempotency key it had: a key that moved to the other send would
    let the service take a's second send for a new one (and b's for a's)."""
    wf, exits = killed_once_then_done(tmp_path, "both_on_their_way", "wf-both")
    assert exits[-1].output() == {"ok": True, "result": ["sent:a", "sent:b"]}
    sends = [(e["args"][1], e["key"], e["pid"]) for e in read_effects(wf.effects)]
    assert len(sends) == 4, sends
    first, second = sends[:2], sends[2:]
    assert [name for name, _, _ in first] == ["a", "b"]  # the first run called a first
    assert [name for name, _, _ in second] == ["b", "a"]  # the recovery b first
    keys = {name: {key for n, key, _ in sends if n == name} for name in "ab"}
    assert all(len(k) == 1 for k in keys.values()), keys  # each kept its key
    assert keys["a"] != keys["b"]
    assert all(key.startswith("wf-both:") for _, key, _ in sends)


def test_steps_of_two_branches_given_a_client_keep_their_own_keys(tmp_path: Path) -> None:
    """As above, each send given a client that cannot be encoded as well as its name: the
    arguments have no digest, and the name must still tell the two calls apart, not
    which one called first (a's key would move to b's send)."""
    wf, exits = killed_once_then_done(tmp_path, "both_on_their_way_through_a_client", "wf-client")
    assert exits[-1].output() == {"ok": True, "result": ["sent:a", "sent:b"]}
    sends = [(e["args"][1], e["key"]) for e in read_effects(wf.effects)]
    assert [name for name, _ in sends] == ["a", "b", "b", "a"], sends
    keys = {name: {key for n, key in sends if n == name} for name in "ab"}
    assert all(len(k) == 1 for k in keys.values()), keys  # each kept its key
    assert keys["a"] != keys["b"]


def test_identical_calls_of_two_branches_keep_their_own_keys(tmp_path: Path) -> None:
    """Two branches call the same step with the same arguments: two effects, two keys.
    One was journaled before the kill, the other was on its way: the recovery runs only
    that one, and under its own key, not the journaled one's (a service would answer it
    as a repeat of the first, and its effect would never happen)."""
    wf, exits = killed_once_then_done(tmp_path, "twins_one_done", "wf-twins")
    assert exits[-1].output() == {"ok": True, "result": ["notified:x", "notified:x"]}
    runs = [(e["key"], e["pid"]) for e in read_effects(wf.effects)]
    assert len(runs) == 3, runs
    (done, _), (cut, killed), (again, pid) = runs
    assert done != cut  # two calls, two keys
    assert again == cut and pid != killed  # the one cut ran again, under its own key
    digests = query(wf.db, "SELECT args_digest FROM journal WHERE workflow_id = 'wf-twins'")
    assert sorted(d.partition("#")[2] for (d,) in digests) == ["1", "2"]  # which twin


def test_a_call_identical_to_the_workflows_own_keeps_its_key(tmp_path: Path) -> None:
    """The workflow function and a task it started call the same step with the same
    arguments after the same call. The workflow's own call is keyed by count and journals
    no twin number; the branch's, cut by the kill, must run again under the key it had,
    not another (a service would take it for a new call: a third effect for two calls)."""
    wf, exits = killed_once_then_done(tmp_path, "twins_of_the_workflow_and_a_branch", "wf-own")
    assert exits[-1].output() == {"ok": True, "result": ["notified:x", "notified:x", "q"]}
    runs = [(e["key"], e["pid"]) for e in read_effects(wf.effects)]
    assert len(runs) == 3, runs
    (done, _), (cut, killed), (again, pid) = runs
    assert done != cut  # two calls, two keys
    assert again == cut and pid != killed, runs  # the one cut ran again, under its own key


# --- in one process: parked after the gather, replayed when the signal comes -------------


LOG: list[str] = []
KEYS: dict[str, str] = {}  # the idempotency key each call ran under, by name


@durably.step
async def call(op: str, name: str, delay: float) -> str:
    await asyncio.sleep(delay)
    LOG.append(f"{op} {name}")
    KEYS[name] = durably.idempotency_key()
    return f"{op}:{name}"


async def branch(name: str, first: float, second: float) -> list[str]:
    return [await call("fetch", name, first), await call("charge", name, second)]


@durably.workflow
async def parked_after_gather() -> list[Any]:
    done = await asyncio.gather(branch("a", 0.3, 0.0), branch("b", 0.0, 0.4))
    await durably.wait_for_signal("go")
    return [*done, await call("after", "all", 0.0)]


@durably.workflow
async def tasks_and_sleeps() -> list[Any]:
    async def slow(name: str) -> list[Any]:
        await durably.sleep(0.3 if name == "a" else 0.0)
        value = await call("value", name, 0.0)
        return [value, durably.now().year > 2000, await call("again", name, 0.0)]

    a = asyncio.create_task(slow("a"))
    b = asyncio.create_task(slow("b"))
    done = [await b, await a]
    await durably.wait_for_signal("go")
    return done


async def _run_parked(url: str, workflow: Any, expected: list[Any]) -> list[str]:
    """Run ``workflow`` to its park, replay it in another engine; returns what ran live."""
    LOG.clear()
    async with durably.Engine(url) as engine:
        handle = await engine.start(workflow, workflow_id="wf")
        await until(handle, "waiting")
        live = list(LOG)
        history = await engine.history("wf")
    assert any(e.follows is not None for e in history), history  # branches interleaved
    async with durably.Engine(url) as engine:  # another engine: a replay from the top
        await engine.send_signal("wf", "go", None)
        assert await engine.handle("wf").result(timeout=10) == expected
        info = await engine.get_workflow("wf")
    assert info.warnings is None  # no call met another's entry
    assert LOG[: len(live)] == live  # nothing recorded ran again
    return live


async def test_a_replay_returns_each_branch_its_own_results(store_url: str) -> None:
    expected = [["fetch:a", "charge:a"], ["fetch:b", "charge:b"], "after:all"]
    live = await _run_parked(store_url, parked_after_gather, expected)
    assert live == ["fetch b", "fetch a", "charge a", "charge b"]
    assert LOG[len(live) :] == ["after all"]


async def test_tasks_with_durable_sleeps_and_values_replay_their_own_calls(
    store_url: str,
) -> None:
    expected = [["value:b", True, "again:b"], ["value:a", True, "again:a"]]
    live = await _run_parked(store_url, tasks_and_sleeps, expected)
    assert live == ["value b", "again b", "value a", "again a"]
    assert live == LOG


CHANGED = False


@durably.step
async def refund(name: str) -> str:
    return f"refund:{name}"


@durably.workflow
async def changes_a_branch() -> list[Any]:
    async def one(name: str, delay: float) -> str:
        await call("fetch", name, delay)
        if CHANGED and name == "a":
            return await refund(name)
        return await call("charge", name, 0.0)

    done = await asyncio.gather(one("a", 0.2), one("b", 0.0))
    await durably.wait_for_signal("go")
    return done


async def test_a_branch_whose_code_changed_still_diverges(sqlite_url: str) -> None:
    """Matching by task does not hide a change of code: a branch that makes another call
    than the one its journal holds there diverges, as a workflow of one task does."""
    global CHANGED
    CHANGED = False
    async with durably.Engine(sqlite_url) as engine:
        handle = await engine.start(changes_a_branch, workflow_id="wf")
        await until(handle, "waiting")
    CHANGED = True
    try:
        async with durably.Engine(sqlite_url) as engine:
            await engine.send_signal("wf", "go", None)
            with pytest.raises(durably.NonDeterminismError) as caught:
                await engine.handle("wf").result(timeout=10)
            info = await engine.get_workflow("wf")
    finally:
        CHANGED = False
    assert info.status == "diverged"
    assert "refund" in str(caught.value) and "seq 4" in str(caught.value), caught.value


@durably.workflow
async def across_an_upgrade() -> list[Any]:
    async def one(name: str) -> str:
        return await call("fetch", name, 0.0)

    before = await asyncio.gather(one("a"), one("b"))
    await durably.wait_for_signal("go")
    after = await asyncio.gather(one("c"), one("d"))
    await durably.wait_for_signal("again")
    return [*before, *after]


def as_an_older_durably_wrote_it(db: Path, *first: str) -> None:
    """Run the statements ``first``, then take the journal's ``follows`` and twins away,
    as a durably older than migration 0013 wrote it."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        for statement in first:
            conn.execute(statement)
        conn.execute(
            "UPDATE journal SET follows = NULL, args_digest = CASE WHEN instr(args_digest, '#')"
            " THEN substr(args_digest, 1, instr(args_digest, '#') - 1) ELSE args_digest END"
        )


async def test_a_journal_begun_before_follows_were_kept_replays_in_seq_order(
    tmp_path: Path,
) -> None:
    """A workflow parked across the upgrade to migration 0013 has entries without
    ``follows`` (seq 1's 0 among them), then entries with: it is replayed in seq order
    as before, not matched by task, which would read the old entries as one task's."""
    db = tmp_path / "durably.db"
    url = f"sqlite:///{db}"
    LOG.clear()
    async with durably.Engine(url) as engine:
        handle = await engine.start(across_an_upgrade, workflow_id="wf")
        await until(handle, "waiting")
    as_an_older_durably_wrote_it(db)
    KEYS.clear()
    async with durably.Engine(url) as engine:
        await engine.send_signal("wf", "go", None)
        await until(engine.handle("wf"), "waiting")
        follows = [e.follows for e in await engine.history("wf")]
    assert follows[0] is None and any(f is not None for f in follows[3:]), follows
    async with durably.Engine(url) as engine:
        await engine.send_signal("wf", "again", None)
        result = await engine.handle("wf").result(timeout=10)
        info = await engine.get_workflow("wf")
    assert result == ["fetch:a", "fetch:b", "fetch:c", "fetch:d"]
    assert sorted(LOG) == ["fetch a", "fetch b", "fetch c", "fetch d"]  # each once
    assert info.warnings is None
    # its steps keep keys by seq, as the code that began it gave them (a step on its way
    # at the upgrade runs again under the key it had)
    assert sorted(KEYS.values()) == ["wf:4", "wf:5"], KEYS


async def test_a_journal_begun_before_follows_whose_seq_1_was_cut_keeps_seq_keys(
    tmp_path: Path,
) -> None:
    """A pre-0013 journal whose first call (a branch's step) a crash cut before its
    receipt has no entry at seq 1 to say when it was begun: its entries without
    ``follows`` still say so, and the cut step runs again under the key an older
    durably gave it (its seq), not under a branch key it never had."""
    db = tmp_path / "durably.db"
    url = f"sqlite:///{db}"
    async with durably.Engine(url) as engine:
        handle = await engine.start(across_an_upgrade, workflow_id="wf")
        await until(handle, "waiting")
    assert query(db, "SELECT name FROM journal WHERE seq = 1") == [("call",)]
    as_an_older_durably_wrote_it(db, "DELETE FROM journal WHERE seq = 1")  # a's fetch cut
    LOG.clear()
    KEYS.clear()
    async with durably.Engine(url) as engine:
        await engine.send_signal("wf", "go", None)
        await until(engine.handle("wf"), "waiting")
        info = await engine.get_workflow("wf")
    assert sorted(LOG) == ["fetch a", "fetch c", "fetch d"]  # a's fetch again, b's not
    assert KEYS["a"] == "wf:1", KEYS
    assert info.warnings is None


async def test_branch_steps_are_keyed_by_what_they_are_and_the_workflows_own_by_count(
    sqlite_url: str,
) -> None:
    """In a journal begun now, a branch's step is keyed by its task's previous call, the
    step and its arguments; the workflow function's own calls by their count: its first
    is the signal wait at seq 3 (the branches' calls took 1 and 2), ``c`` its second."""
    KEYS.clear()
    async with durably.Engine(sqlite_url) as engine:
        await engine.start(keyed_by_task, workflow_id="wf")
        await until(engine.handle("wf"), "waiting")
        await engine.send_signal("wf", "go", None)
        assert await engine.handle("wf").result(timeout=10) == ["fetch:a", "fetch:b", "own:c"]
    assert KEYS["c"] == "wf:2"
    assert KEYS["a"].startswith("wf:0.") and KEYS["b"].startswith("wf:0.")
    assert len({KEYS["a"], KEYS["b"]}) == 2 and all(
        len(k) == len("wf:0.") + 12 for k in KEYS.values() if "." in k
    )


@durably.workflow
async def keyed_by_task() -> list[Any]:
    async def one(name: str) -> str:
        return await call("fetch", name, 0.0)

    before = await asyncio.gather(one("a"), one("b"))
    await durably.wait_for_signal("go")
    return [*before, await call("own", "c", 0.0)]


# --- the matching itself, table by table (replay.Replayer: no I/O) --------------------------


def _entry(seq: int, kind: str, follows: int | None, digest: str | None = None) -> Any:
    name = "work" if kind == "step" else ""
    return durably.Entry(seq, kind, name, "completed", args_digest=digest, follows=follows)


def _take(
    replayer: Any,
    follows: int,
    kind: str,
    digest: str | None = None,
    *,
    new: bool = False,
    name: str | None = None,
) -> int:
    """The seq a call takes: ``new``, the first call of a task begun after ``follows``;
    a step is named ``work`` unless ``name`` says."""
    if name is None:
        name = "work" if kind == "step" else ""
    seq: int = replayer.next_seq(follows, kind, name, digest, new_task=new)
    return seq


def test_a_call_on_its_way_at_a_crash_keeps_its_seq_among_its_siblings() -> None:
    """Three tasks began at once: the first journaled its step (seq 1), the second's step
    (seq 2) was on its way at the crash, the third journaled a value (3) and a step (4).
    The second's step must take seq 2 again, not the third's value at 3."""
    from durably import replay

    r = replay.Replayer("wf", [_entry(1, "step", 0), _entry(3, "now", 0), _entry(4, "step", None)])
    assert _take(r, 0, "step", new=True) == 1
    assert _take(r, 0, "step", new=True) == 2  # the hole, not the `now` at 3
    assert _take(r, 0, "now", new=True) == 3
    assert _take(r, 3, "step") == 4
    assert _take(r, 1, "step") == 5  # new: one past every seq
    r.check_finished()


def test_a_tasks_first_call_never_takes_a_siblings_entry() -> None:
    """The first task journaled a value (1), a step (2) and a value (3); the third its
    value (4); the second's step was on its way at the crash, after every journaled seq.
    It is new (5), not the third's value at 4, which the third then takes."""
    from durably import replay

    r = replay.Replayer(
        "wf",
        [_entry(1, "now", 0), _entry(2, "step", None), _entry(3, "now", None), _entry(4, "now", 0)],
    )
    assert _take(r, 0, "now", new=True) == 1
    assert _take(r, 0, "step", new=True) == 5
    assert _take(r, 0, "now", new=True) == 4
    assert [_take(r, 1, "step"), _take(r, 2, "now")] == [2, 3]
    r.check_finished()


def test_a_step_with_its_siblings_arguments_takes_its_own_seq() -> None:
    """Two tasks call the same step with other arguments; the first's (seq 1) was on its
    way at the crash: it takes seq 1, not its sibling's receipt at 2 (digest b)."""
    from durably import replay

    r = replay.Replayer("wf", [_entry(2, "step", 0, "b"), _entry(3, "step", 2, "b2")])
    assert _take(r, 0, "step", "a", new=True) == 1
    assert _take(r, 0, "step", "b", new=True) == 2
    assert _take(r, 2, "step", "b2") == 3


def test_matching_still_reports_a_changed_call() -> None:
    """A task's later call meets no call of its kind and no seq never journaled: the
    recorded call is taken, and its lookup reports the divergence at once (before the
    changed call runs); one with other arguments is taken (and warned of)."""
    from durably import replay

    r = replay.Replayer(
        "wf", [_entry(1, "step", 0, "a"), _entry(2, "step", 0, "b"), _entry(3, "now", 1)]
    )
    assert _take(r, 0, "step", "a") == 1
    assert _take(r, 0, "step", "changed") == 2
    assert _take(r, 1, "step") == 3
    with pytest.raises(durably.NonDeterminismError):
        r.lookup(3, "step", "work")


def test_a_cancellation_is_taken_by_the_call_it_was_delivered_to() -> None:
    """Two tasks began at once: the cancellation was delivered to the second's step
    (seq 2, a marker naming it); the first's step was on its way at the crash (seq 1,
    not journaled). On the replay the first calls first: it must not take the marker
    (it would raise Cancelled where the first run's did not, and the second's step,
    which the first run never ran, would run), but the seq it had."""
    from durably import replay

    marker = durably.Entry(2, "cancel", "step 'work'", "completed", follows=0)
    r = replay.Replayer("wf", [marker])
    assert _take(r, 0, "step", "a", new=True, name="other") == 1
    assert _take(r, 0, "step", "b", new=True) == 2
    assert r.lookup(2, "step", "work") == marker


def test_a_marker_that_names_no_call_is_taken_by_any_as_before() -> None:
    """A marker journaled before markers named their call stands for any call there."""
    from durably import replay

    r = replay.Replayer("wf", [durably.Entry(2, "cancel", "", "completed", follows=0)])
    assert _take(r, 0, "step", "a", new=True, name="other") == 2


def test_a_journal_begun_before_follows_is_read_in_seq_order() -> None:
    from durably import replay

    r = replay.Replayer("wf", [_entry(1, "step", None), _entry(2, "step", 0)])
    assert not r.matching
    assert [_take(r, 0, "step"), _take(r, 0, "step"), _take(r, 0, "step")] == [1, 2, 3]


# --- a branch that fails while its sibling goes on ------------------------------------------


@durably.workflow
async def one_branch_fails() -> list[Any]:
    async def failing() -> None:
        await call("first", "a", 0.0)
        raise ValueError("branch a failed")

    async def going_on() -> str:
        await call("first", "b", 0.3)
        return await call("second", "b", 0.0)  # after the gather raised: refused

    return list(await asyncio.gather(failing(), going_on()))


async def test_a_failing_branch_fails_the_workflow_while_its_sibling_goes_on(
    store_url: str,
) -> None:
    """The gather raises at once; the function's error is its outcome, though the other
    branch's step commits after it and its next call is refused (the workflow was left
    running, with nothing to drive it, until its executor restarted)."""
    LOG.clear()
    async with durably.Engine(store_url) as engine:
        handle = await engine.start(one_branch_fails, workflow_id="wf")
        with pytest.raises(ValueError, match="branch a failed"):
            await handle.result(timeout=10)
        info = await engine.get_workflow("wf")
    assert info.status == "failed" and info.owner is None
    assert sorted(LOG) == ["first a", "first b"]  # b's second call never ran


@durably.workflow
async def raced_then_gathered() -> list[Any]:
    index, _ = await durably.wait_first(durably.wait_for_signal("stop"), durably.sleep(0.2))
    done = await asyncio.gather(branch("a", 0.3, 0.0), branch("b", 0.0, 0.4))
    await durably.wait_for_signal("go")
    return [index, *done, await call("after", "all", 0.0)]


async def test_a_journal_whose_first_call_lost_a_race_replays_each_branch_its_own(
    store_url: str,
) -> None:
    """The workflow's first call is a signal wait that loses a wait_first: its entry is
    dropped (decide_race), so the journal's first entry is seq 2, which followed seq 1
    and journals no ``follows``. That must not read as a journal begun before 0013
    (replayed in seq order): the gather after it is matched by task, each branch its own."""
    expected = [1, ["fetch:a", "charge:a"], ["fetch:b", "charge:b"], "after:all"]
    live = await _run_parked(store_url, raced_then_gathered, expected)
    assert live == ["fetch b", "fetch a", "charge a", "charge b"]
    assert LOG[len(live) :] == ["after all"]
