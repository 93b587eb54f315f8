"""Matching the code's durable calls against the journal (pure: no I/O, no clock).

The workflow is re-run from its first line; every durable call takes the next
seq in program order and asks the replayer what the journal holds there. A call
whose kind or name differs from the recorded one is a divergence: the replayer
raises :class:`~durably.errors.NonDeterminismError` and keeps raising it, so a
workflow that catches the first one still cannot go on.
"""

from __future__ import annotations

from collections.abc import Iterable

from durably import errors, journal


class Replayer:
    """The journal of one workflow run, consumed seq by seq."""

    __slots__ = ("_diverged", "_entries", "_last_seq", "workflow_id")

    def __init__(self, workflow_id: str, entries: Iterable[journal.Entry]) -> None:
        self.workflow_id = workflow_id
        self._entries = {e.seq: e for e in entries}
        self._last_seq = 0
        self._diverged: errors.NonDeterminismError | None = None

    @property
    def diverged(self) -> errors.NonDeterminismError | None:
        """The divergence found so far, if any."""
        return self._diverged

    @property
    def last_seq(self) -> int:
        """The seq most recently handed out."""
        return self._last_seq

    def next_seq(self) -> int:
        """Take the seq for the next durable call, in program order."""
        self._last_seq += 1
        return self._last_seq

    def lookup(self, seq: int, kind: str, name: str) -> journal.Entry | None:
        """What the journal holds at ``seq`` for this call, or None when it is new.

        Raises NonDeterminismError when the journal recorded another call there.
        A ``cancel`` entry is returned whatever was asked: the caller raises
        Cancelled there, as the first run did.
        """
        if self._diverged is not None:
            raise self._diverged
        entry = self._entries.get(seq)
        if entry is None or entry.kind == journal.Kind.CANCEL:
            return entry  # a cancellation delivered here stands in for any call
        if entry.kind != kind or entry.name != name:
            self._diverged = errors.NonDeterminismError(
                self.workflow_id, seq, entry.describe(), journal.describe_call(kind, name)
            )
            raise self._diverged
        return entry

    def record(self, entry: journal.Entry) -> None:
        """Remember an entry this run has just committed."""
        self._entries[entry.seq] = entry

    def check_finished(self) -> None:
        """Raise NonDeterminismError if the journal holds calls the code never made."""
        if self._diverged is not None:
            raise self._diverged
        beyond = [seq for seq in self._entries if seq > self._last_seq]
        if beyond:
            entry = self._entries[min(beyond)]
            self._diverged = errors.NonDeterminismError(
                self.workflow_id, entry.seq, entry.describe(), None
            )
            raise self._diverged
