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


def receipts(entries: Sequence[journal.Entry], claims: Sequence[journal.Claim]) -> list[Row]:
    """The journal in seq order with a Gap before the first entry written after each recovery."""
    recoveries = sorted((c for c in claims if c.reason == "recovery"), key=lambda c: c.claimed_at)
    claim_times = sorted(c.claimed_at for c in claims)
    rows: list[Row] = []
    pending = list(recoveries)
    for entry in entries:
        written = entry.finished_at or entry.started_at or 0.0
        while pending and written >= pending[0].claimed_at:
            rows.append(_gap(pending.pop(0), entries, claim_times))
        rows.append(entry)
    rows.extend(_gap(claim, entries, claim_times) for claim in pending)
    return rows


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
    text = " ".join(payload.split())
    return text if len(text) <= width else text[: width - 1] + "…"
