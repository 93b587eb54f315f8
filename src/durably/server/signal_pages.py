"""One page of a workflow's signals, as the dashboard's workflow page and the API show it.

A chat-style agent receives each of its user's messages as a signal: tens of thousands
of them, of a kilobyte or so each. A page of them is read through the signals' primary
key (``Client.signals_page``) and their count from the journal's mark
(``Client.history_mark``), so a look at such a workflow costs a page, not every
message. Whoever pages on from a page's first num (``before_num``) sees every signal
exactly once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from durably import client as client_module
from durably import validate

#: Signals on a page of the dashboard's workflow page, and of the API's paged history
#: and signals routes unless asked for another size: the newest, unless asked for others.
SIGNALS_PAGE = 50


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """Signals of a workflow in num order (the dicts of ``Client.signals``), how many it
    has, and how to page on."""

    signals: list[dict[str, Any]]
    #: How many signals the workflow holds (as its mark counted them).
    count: int
    limit: int
    #: The ``before_num`` of the page before this one; None when this one starts them.
    earlier_before_num: int | None
    #: What was asked: the page before this num (None: the newest).
    before_num: int | None = None

    def describe(self) -> dict[str, Any]:
        """The page as the API's signals route returns it (payloads as stored)."""
        return {
            "signals": self.signals,
            "count": self.count,
            "limit": self.limit,
            "earlier_before_num": self.earlier_before_num,
        }


def read(
    client: client_module.Client,
    workflow_id: str,
    *,
    before_num: int | None = None,
    limit: int = SIGNALS_PAGE,
    count: int | None = None,
) -> Page:
    """The page of ``workflow_id``'s signals that the arguments name (as
    ``Client.signals_page`` takes them): one more signal is read to tell whether earlier
    ones remain; ``count``, the signals' count when the caller read the mark already.
    WorkflowNotFound for an unknown id; ValueError for arguments it refuses."""
    size = validate.count(limit, "limit", high=validate.BIGINT[1] - 1)
    found = client.signals_page(workflow_id, before_num=before_num, limit=size + 1)
    signals = found[-size:]
    earlier = int(signals[0]["num"]) if len(found) > size else None
    if count is None:  # not read with the page's journal already
        count = client.history_mark(workflow_id).signals
    return Page(signals, count, size, earlier, before_num)
