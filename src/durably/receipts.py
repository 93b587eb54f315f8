"""The receipts view of a workflow: its journal with the recoveries marked (pure).

``durably show`` prints these rows. Wherever an executor recovered the
workflow from a dead owner, a gap row says how long nothing happened: the
process was dead there, and every entry above was replayed, not re-run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from durably import journal


@dataclasses.dataclass(frozen=True, slots=True)
class Gap:
    """A recovery: the seconds between the last sign of life and the new owner's claim."""

    seconds: float
    claim: journal.Claim

    def line(self) -> str:
        """The line ``show`` prints for it."""
        return (
            f"---- {self.seconds:.1f}s gap: the process was dead here; "
            "everything above was replayed ----"
        )


Row = journal.Entry | Gap


def receipts(
    entries: Sequence[journal.Entry],
    claims: Sequence[journal.Claim],
    *,
    before: Sequence[journal.Entry] = (),
    after: Sequence[journal.Entry] = (),
    to_end: bool = True,
) -> list[Row]:
    """The journal in seq order with a Gap before the first entry written after each recovery.

    ``entries`` may be one page of the journal: ``before`` and ``after`` are then entries
    just before and after it in seq order (not shown), and ``to_end`` whether the page
    reaches the journal's end. The page holds the gaps the whole journal's receipts put
    among its entries, as long: a gap goes before the first entry in seq order written
    after its recovery, so one claimed before an entry of ``before`` was written is on
    an earlier page, and one after the page's last entry on a later page (at the end
    only when ``to_end``); its length is from the last sign of life of any entry seen.
    Calls in flight together finish out of seq order: ``before`` and ``after`` must
    hold as many entries as may have been in flight together around a recovery.
    """
    recoveries = sorted((c for c in claims if c.reason == "recovery"), key=lambda c: c.claimed_at)
    claim_times = sorted(c.claimed_at for c in claims)
    seen = [*before, *entries, *after]
    if before:  # placed by the pages before, as late as they were written
        since = max(written(e) for e in before)
        recoveries = [c for c in recoveries if c.claimed_at > since]
    rows: list[Row] = []
    pending = list(recoveries)
    for entry in entries:
        at = written(entry)
        while pending and at >= pending[0].claimed_at:
            rows.append(_gap(pending.pop(0), seen, claim_times))
        rows.append(entry)
    if to_end:
        rows.extend(_gap(claim, seen, claim_times) for claim in pending)
    return rows


def written(entry: journal.Entry) -> float:
    """When the entry was last written (how receipts order it against the claims)."""
    return entry.finished_at or entry.started_at or 0.0


def _gap(
    claim: journal.Claim, entries: Sequence[journal.Entry], claim_times: Sequence[float]
) -> Gap:
    before = [
        t
        for e in entries
        for t in (e.started_at, e.finished_at)
        if t is not None and t < claim.claimed_at
    ]
    before += [t for t in claim_times if t < claim.claimed_at]
    last_alive = max(before, default=claim.claimed_at)
    return Gap(claim.claimed_at - last_alive, claim)


def label(entry: journal.Entry) -> str:
    """The call as a receipt names it: the step's name, or ``sleep() name``, with its
    status when it did not complete (``charge (started)``)."""
    name = entry.name if entry.kind == "step" else f"{entry.kind}() {entry.name}".strip()
    return name + ("" if entry.status == "completed" else f" ({entry.status})")


def preview(payload: str | None, width: int = 60) -> str:
    """A one-line preview of a JSON payload."""
    if payload is None:
        return ""
    # A head's whitespace collapsed is the start of the whole payload's: a long one (a
    # model's answer) is split whole only when its head collapses to less than the line.
    head = width * 4
    text = " ".join(payload[:head].split())
    if len(text) <= width and len(payload) > head:
        text = " ".join(payload.split())
    return text if len(text) <= width else text[: width - 1] + "…"
