"""One page of a workflow's journal, as the dashboard's workflow page and the API's
history route show it.

A long agent's journal holds tens of thousands of entries of kilobytes each: a page
of it is read through the journal's primary key (``Client.history_page``), its size
from the journal's mark (``Client.history_mark``), and the usage line from the model
calls alone (``Client.history_steps``), so a look at such a workflow costs a page, not
its whole history. Whoever pages on from a page's first seq (``before_seq``) or its
last (``after_seq``) sees every entry exactly once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from durably import client as client_module
from durably import journal, validate
from durably.agents import usage as agent_usage

#: Entries on a page of the dashboard's timeline (its newest, unless asked for another).
TIMELINE_PAGE = 200
#: Entries read on each side of a page to place and measure its gap lines: calls in
#: flight together finish out of seq order, and a recovery's gap goes before the first
#: entry in seq order written after it, which may be before the page even when the entry
#: just before it is older; its length runs from the last sign of life of any entry.
#: Exact unless more calls than this were in flight together around a recovery.
GAP_WINDOW = 200

_LOWEST, _HIGHEST = validate.BIGINT


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """Entries of a journal in seq order, where they stand in it, and how to page on."""

    entries: list[journal.Entry]
    limit: int
    #: Entries just before the page and after it, in seq order, not shown (up to
    #: ``GAP_WINDOW`` of a recovered workflow's): its gap lines are placed and measured
    #: against them.
    before: list[journal.Entry]
    after: list[journal.Entry]
    #: The journal's mark as read with the page (its count, the signals' count).
    mark: journal.HistoryMark
    #: What was asked: the page after this seq, or before it (neither: the newest).
    after_seq: int | None = None
    before_seq: int | None = None

    @property
    def count(self) -> int:
        """How many entries the whole journal holds (as its mark counted them)."""
        return self.mark.entries

    @property
    def prior(self) -> journal.Entry | None:
        """The entry just before the page, None when none is."""
        return self.before[-1] if self.before else None

    @property
    def later(self) -> bool:
        """Whether entries follow the page."""
        return bool(self.after)

    @property
    def ends_journal(self) -> bool:
        """Whether the page holds the journal's end, where the gap lines of recoveries
        after its last entry go: nothing follows it, and it holds the last entry (or the
        journal has none). A page past the end leaves them to the page before it."""
        return not self.later and (bool(self.entries) or self.prior is None)

    @property
    def earlier_before_seq(self) -> int | None:
        """The ``before_seq`` of the page before this one; None when this one starts
        the journal."""
        if self.prior is None:
            return None
        return self.entries[0].seq if self.entries else min(self.prior.seq + 1, _HIGHEST)

    @property
    def later_after_seq(self) -> int | None:
        """The ``after_seq`` of the page after this one; None when this one ends the
        journal (for now: a running workflow journals more)."""
        if not self.later:
            return None
        if self.entries:
            return self.entries[-1].seq
        return max((self.before_seq if self.before_seq is not None else _HIGHEST) - 1, _LOWEST)

    def describe(self) -> dict[str, Any]:
        """The page's place as the API returns it, with the parameters of its neighbours."""
        return {
            "limit": self.limit,
            "count": self.count,
            "first_seq": self.entries[0].seq if self.entries else None,
            "last_seq": self.entries[-1].seq if self.entries else None,
            "earlier_before_seq": self.earlier_before_seq,
            "later_after_seq": self.later_after_seq,
        }


def read(
    client: client_module.Client,
    workflow_id: str,
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    limit: int,
    claims: Sequence[journal.Claim] | None = None,
) -> Page:
    """The page of ``workflow_id``'s journal that the arguments name (as
    ``Client.history_page`` takes them), with entries on each side: one, to tell whether
    the page has neighbours, or up to ``GAP_WINDOW`` when the workflow was recovered
    (``claims``, read when not given, hold a recovery), to place its gap lines.
    WorkflowNotFound for an unknown id; ValueError for arguments it refuses."""
    size = validate.count(limit, "limit")
    if claims is None:
        claims = client.claims(workflow_id)
    window = GAP_WINDOW if any(c.reason == "recovery" for c in claims) else 1
    if after_seq is None:
        found = client.history_page(workflow_id, before_seq=before_seq, limit=size + window)
        entries, before = found[-size:], found[:-size]
        after: list[journal.Entry] = []
        if before_seq is not None:  # entries may follow: the page does not end at the newest
            start = entries[-1].seq if entries else max(before_seq - 1, _LOWEST)
            after = client.history_page(workflow_id, after_seq=start, limit=window)
    else:
        found = client.history_page(  # with both seqs it refuses them, as it should
            workflow_id, after_seq=after_seq, before_seq=before_seq, limit=size + window
        )
        entries, after = found[:size], found[size:]
        edge = entries[0].seq if entries else min(after_seq + 1, _HIGHEST)
        before = client.history_page(workflow_id, before_seq=edge, limit=window)
    mark = client.history_mark(workflow_id)
    return Page(entries, limit, before, after, mark, after_seq, before_seq)


def model_calls(client: client_module.Client, workflow_id: str) -> list[journal.Entry]:
    """The journal's model-call steps, which the usage line sums over the whole workflow
    whatever page is shown: chosen by the database, not read with every entry."""
    return client.history_steps(workflow_id, agent_usage.MODEL_STEP_PREFIX)
