"""What a parked workflow waits for, as the workflow page says it: read from its open
journal entries (a signal, a sleep, a child, another workflow's event, a step's retry).

The journal's mark lists the open entries' seqs (``journal.HistoryMark.open``); those on
the page shown are taken from it, any other is read by its seq alone, so a look costs a
few rows whatever the journal's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from durably import client as client_module
from durably import journal

#: The most open entries described (a workflow running many waits at once says the first).
MOST = 10

_SIGNAL, _SLEEP, _JOIN, _GET_EVENT, _STEP = (
    journal.Kind.SIGNAL,
    journal.Kind.SLEEP,
    journal.Kind.JOIN,
    journal.Kind.GET_EVENT,
    journal.Kind.STEP,
)


def waits(
    client: client_module.Client,
    workflow_id: str,
    mark: journal.HistoryMark,
    shown: Sequence[journal.Entry],
) -> list[dict[str, Any]]:
    """What the workflow waits for, one dict per open wait in seq order (``describe``);
    ``shown``: the entries on the page, not read again."""
    on_page = {e.seq: e for e in shown}
    found: list[dict[str, Any]] = []
    for seq, _status, _attempt in mark.open:
        entry = on_page.get(seq)
        if entry is None:
            read = client.history_page(workflow_id, after_seq=seq - 1, limit=1)
            entry = read[0] if read and read[0].seq == seq else None
        described = None if entry is None else describe(entry)
        if described is not None:
            found.append(described)
            if len(found) == MOST:
                break
    return found


def describe(entry: journal.Entry) -> dict[str, Any] | None:
    """An open entry as a wait: ``kind`` (signal, sleep, child, event, retry), ``name``
    (the signal's, the child's id, the event's key, the step's), ``of`` (the workflow
    publishing the event), ``since`` and ``until`` (its timeout or wake-up time, or None).
    None for an entry that waits for nothing outside the workflow (a step running)."""
    if entry.status not in journal.OPEN_ENTRY_STATUSES:
        return None
    since, until = entry.started_at, entry.wake_at
    wait: dict[str, Any] = {"name": entry.name, "of": None, "since": since, "until": until}
    if entry.kind == _SIGNAL:
        return {**wait, "kind": "signal"}
    if entry.kind == _SLEEP:
        return {**wait, "kind": "sleep"}
    if entry.kind == _JOIN:
        return {**wait, "kind": "child"}
    if entry.kind == _GET_EVENT:
        key, _, source = entry.name.partition(" of ")
        return {**wait, "kind": "event", "name": key, "of": source}
    if entry.kind == _STEP and entry.status == journal.EntryStatus.RETRYING:
        return {**wait, "kind": "retry", "attempt": entry.attempt}
    return None
