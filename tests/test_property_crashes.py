"""Property: any workflow shape, killed at any boundaries, recovers to the right result.

A shape is a list of ops (a deterministic step, a step that fails k times and is
retried, ``durably.now()``, ``durably.random()``, ``durably.uuid4()``, an
``asyncio.gather`` over 2-3 steps) interpreted by the ``shape`` workflow of
``tests.crashkit.flows``. Each run of a child is SIGKILLed at a fresh random
boundary (``DURABLY_CRASH_AT=#N``) until a clean run finishes it.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import itertools
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import durably
from durably import codec
from tests.crashkit import flows
from tests.crashkit.harness import Workflow, journal_rows, query, read_effects, run_until_done

VALUE_KINDS = {"now": "now", "random": "random", "uuid4": "uuid4"}

params = st.integers(min_value=0, max_value=999)
plain_or_flaky = st.fixed_dictionaries({"p": params, "k": st.integers(min_value=0, max_value=2)})
ops = st.one_of(
    st.builds(lambda p: {"op": "step", "p": p}, params),
    st.builds(lambda p, k: {"op": "step", "p": p, "k": k}, params, st.integers(1, 2)),
    st.sampled_from([{"op": "now"}, {"op": "random"}, {"op": "uuid4"}]),
    st.builds(
        lambda items: {"op": "gather", "items": items},
        st.lists(plain_or_flaky, min_size=2, max_size=3),
    ),
)
shapes = st.lists(ops, min_size=1, max_size=7)
# one entry per killed run: a number turned into a boundary index within the shape's range
kills = st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=3)


def expected_calls(shape: list[dict[str, Any]]) -> list[tuple[int, str, str, dict[str, Any]]]:
    """(op index, journal kind, name, op item) for every seq the shape takes, in order."""
    calls = []
    for index, op in enumerate(shape):
        if op["op"] in VALUE_KINDS:
            calls.append((index, VALUE_KINDS[op["op"]], "", op))
        elif op["op"] == "step":
            calls.append((index, "step", "flaky_det" if op.get("k") else "det", op))
        else:
            for item in op["items"]:
                calls.append((index, "step", "flaky_det" if item["k"] else "det", item))
    return calls


def boundary_bound(shape: list[dict[str, Any]]) -> int:
    """At least as many crash boundaries as an uninterrupted run reaches."""
    steps = [c for c in expected_calls(shape) if c[1] == "step"]
    failures = sum(c[3].get("k", 0) for c in steps)
    # engine_start + (before_call, after_call, after_receipt) per step
    # + (before_call, in_backoff) per failed attempt + before_finish
    return 1 + 3 * len(steps) + 2 * failures + 1


def reference_run(shape: list[dict[str, Any]], seed: int, where: Path) -> dict[str, Any]:
    """The shape run uninterrupted, in this process, on its own database."""

    async def main() -> Any:
        async with durably.Engine(f"sqlite:///{where / 'reference.db'}") as engine:
            handle = await engine.start(flows.shape, shape, seed, workflow_id="reference")
            return await handle.result(timeout=30)

    old = os.environ.get(flows.EFFECTS_ENV)
    os.environ[flows.EFFECTS_ENV] = str(where / "reference-effects.jsonl")
    try:
        return asyncio.run(main())  # type: ignore[no-any-return]
    finally:
        if old is None:
            del os.environ[flows.EFFECTS_ENV]
        else:
            os.environ[flows.EFFECTS_ENV] = old


def as_observed(kind: str, payload: str) -> Any:
    """A journaled value as the workflow hands it to later steps."""
    value = codec.decode(payload, where="test")
    if kind == "now":
        assert isinstance(value, datetime.datetime)
        return value.isoformat()
    if kind == "uuid4":
        assert isinstance(value, uuid.UUID)
        return str(value)
    assert isinstance(value, float)
    return value


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(shape=shapes, seed=st.integers(min_value=0, max_value=10**6), kill_at=kills)
def test_random_shapes_survive_random_kills(
    tmp_path_factory: pytest.TempPathFactory,
    shape: list[dict[str, Any]],
    seed: int,
    kill_at: list[int],
) -> None:
    where = tmp_path_factory.mktemp("shape")
    wf = Workflow(
        db=where / "durably.db",
        workflow="shape",
        workflow_id="wf-shape",
        args=[shape, seed],
        effects=where / "effects.jsonl",
    )
    bound = boundary_bound(shape)
    # a recovering run replays what is done and reaches fewer boundaries: aim lower each time
    plan = [{"DURABLY_CRASH_AT": f"#{1 + n % max(2, bound >> i)}"} for i, n in enumerate(kill_at)]
    exits = run_until_done(wf, plan, max_runs=len(plan) + 1)
    kills_done = sum(e.killed for e in exits)

    out = exits[-1].output()
    assert out["ok"] is True, out
    result = out["result"]
    calls = expected_calls(shape)

    # deterministic parts equal an uninterrupted run
    reference = reference_run(shape, seed, where)
    assert result["acc"] == reference["acc"]
    assert result["outputs"] == reference["outputs"]
    assert len(result["values"]) == len(reference["values"])

    # the journal: one row per seq, 1..n, of the kinds and names the shape implies
    duplicates = query(
        wf.db,
        "SELECT workflow_id, seq, COUNT(*) FROM journal GROUP BY workflow_id, seq "
        "HAVING COUNT(*) > 1",
    )
    assert duplicates == []
    rows = journal_rows(wf.db, wf.workflow_id)
    assert [r["seq"] for r in rows] == list(range(1, len(calls) + 1))
    assert [(r["kind"], r["name"]) for r in rows] == [(c[1], c[2]) for c in calls]
    assert all(r["status"] == "completed" for r in rows), rows
    for row, call in zip(rows, calls, strict=True):
        if call[1] == "step":
            assert row["attempt"] == call[3].get("k", 0) + 1, (row, call)

    # journaled values: the result holds exactly what the journal recorded
    recorded_values = [as_observed(r["kind"], r["payload"]) for r in rows if r["kind"] != "step"]
    assert result["values"] == recorded_values

    effects = read_effects(wf.effects)
    assert {e["wf"] for e in effects} <= {wf.workflow_id}
    by_seq: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in effects:
        by_seq[e["seq"]].append(e)
    step_seqs = [seq for seq, c in enumerate(calls, start=1) if c[1] == "step"]
    assert sorted(by_seq) == step_seqs  # every step ran, nothing else did

    values_before = list(itertools.accumulate(op["op"] in VALUE_KINDS for op in shape))
    keys = {}
    for seq, runs in by_seq.items():
        index, _, name, item = calls[seq - 1]
        assert {e["step"] for e in runs} == {name}
        # one idempotency key across all attempts and recoveries
        assert len({e["key"] for e in runs}) == 1, runs
        keys[seq] = runs[0]["key"]
        # the same inputs every time: journaled values seen by a step never change
        assert all(e["args"] == runs[0]["args"] for e in runs), runs
        observed = runs[0]["args"][-1]
        assert observed == recorded_values[: values_before[index]]
        assert runs[0]["args"][0] == index
        # attempts only move forward; each failure is journaled, so it is not repeated
        attempts = [e["attempt"] for e in runs]
        assert attempts == sorted(attempts), attempts
        assert set(attempts) == set(range(1, item.get("k", 0) + 2)), attempts
        # a kill can repeat an attempt, but only as often as there were kills
        assert len(runs) <= len(set(attempts)) + kills_done, (runs, kills_done)
    assert len(set(keys.values())) == len(keys), keys

    # a step never starts again once a later op's step has started
    op_order = [e["args"][0] for e in effects]
    assert op_order == sorted(op_order), op_order


branch_items = st.fixed_dictionaries(
    {"p": params, "delay": st.sampled_from([0.0, 0.005, 0.02, 0.05]), "now": st.booleans()}
)
branch_specs = st.lists(st.lists(branch_items, min_size=1, max_size=3), min_size=2, max_size=3)


@settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],  # no shrinking: its runs take minutes
)
@given(spec=branch_specs, seed=st.integers(min_value=0, max_value=10**6), kill_at=kills)
def test_random_branches_of_a_gather_survive_random_kills(
    tmp_path_factory: pytest.TempPathFactory,
    spec: list[list[dict[str, Any]]],
    seed: int,
    kill_at: list[int],
) -> None:
    """Branches of several steps each, whose steps end in a different order in every run
    (their delays race), killed at random boundaries: every branch gets its own results,
    every step ran with the same arguments (the journaled ``now()`` its branch read
    included), and none ran again unless a kill cut it."""
    where = tmp_path_factory.mktemp("branches")
    wf = Workflow(
        db=where / "durably.db",
        workflow="branches",
        workflow_id="wf-branches",
        args=[spec, seed],
        effects=where / "effects.jsonl",
    )
    steps = sum(len(items) for items in spec)
    bound = 1 + 3 * steps + 1  # engine_start, three per step, before_finish
    plan = [{"DURABLY_CRASH_AT": f"#{1 + n % max(2, bound >> i)}"} for i, n in enumerate(kill_at)]
    try:
        exits = run_until_done(wf, plan, max_runs=len(plan) + 1)
    except AssertionError as exc:  # say what ran, and the journal it left
        rows = query(wf.db, "SELECT seq, kind, name, status, follows FROM journal ORDER BY seq")
        raise AssertionError(f"spec={spec!r} seed={seed} plan={plan}\n{rows}\n{exc}") from None
    kills_done = sum(e.killed for e in exits)

    out = exits[-1].output()
    assert out["ok"] is True, out
    accs = []
    for branch, items in enumerate(spec):
        acc = seed + branch
        for item in items:
            acc = flows.mix(acc, item["p"])
        accs.append(acc)
    assert [acc for acc, _ in out["result"]] == accs

    rows = journal_rows(wf.db, wf.workflow_id)
    step_rows = [r for r in rows if r["kind"] == "step"]
    assert len(step_rows) == steps and all(r["status"] == "completed" for r in rows), rows
    assert query(wf.db, "SELECT warnings FROM workflows") == [(None,)]

    runs: dict[tuple[int, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for e in read_effects(wf.effects):
        runs[e["args"][0], e["args"][1]].append(e)
    assert sorted(runs) == [(b, i) for b, items in enumerate(spec) for i in range(len(items))]
    keys = set()
    for (branch, index), done in runs.items():
        # a run cut by a kill runs again under the same key, whatever seq it takes then (a
        # step of a task run at once that was on its way has no entry to keep its seq by)
        assert all(e["args"] == done[0]["args"] for e in done), done  # the same inputs
        assert len({e["key"] for e in done}) == 1, done
        assert len(done) <= 1 + kills_done, (done, kills_done)
        keys.add(done[-1]["key"])
        receipt = next(r for r in step_rows if r["seq"] == done[-1]["seq"])
        assert codec.decode(receipt["payload"], where="test") == flows.mix(
            done[0]["args"][2], spec[branch][index]["p"]
        )
    assert len(keys) == steps
