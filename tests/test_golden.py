"""The golden journals of the examples keep replaying against today's code (tests/golden).

A change that makes a recorded example journal diverge, or a recorded value
undecodable, fails here before it reaches a deployment with workflows in flight.
Regenerate the archives with ``python -m tests.golden.regenerate`` only when an
example's durable calls change on purpose.
"""

from __future__ import annotations

import asyncio

import pytest

from durably import rehearsal
from durably.testing import FakeModelServer, by_turn
from tests import golden


def test_every_example_has_a_golden_archive() -> None:
    examples = sorted(p.stem for p in golden.EXAMPLES_DIR.glob("*.py"))
    assert examples == sorted(golden.EXAMPLES)
    assert sorted(p.stem for p in golden.GOLDEN.glob("*.jsonl")) == examples


@pytest.mark.parametrize("name", sorted(golden.EXAMPLES))
def test_the_golden_journal_of_the_example_replays_whole(name: str) -> None:
    module = golden.load(name)
    with FakeModelServer(by_turn([])) as server:  # answers nothing: a model call would fail
        module.build(golden.EXAMPLES[name](server))
        recorded = rehearsal.from_archive(golden.archive_of(name))
        report = asyncio.run(rehearsal.rehearse(recorded, strict_replay=True))
        assert report.ok, [p.line() for p in report.problems]
        assert report.whole == ("t-1",), report  # the code ran to its end in the journal
        assert server.requests == []
