"""Idempotency keys of step calls: the same for a call on every attempt and recovery.

A workflow of one task keys its steps by seq (``"<workflow_id>:<seq>"``). Tasks run at
once (``asyncio.gather``) call in whatever order their awaits end, and a step a crash
cut before its receipt has no entry to keep its seq by: on the recovery it may take
another seq, and a key made of that seq would move to another call, so a service
that deduplicates by key would take a repeated refund for a new one. So the
workflow's own task keys its calls by how many it has made (its seq, in a workflow
of one task), and another task's call is keyed by what it is: the call its task
made before it (a seq that was journaled, so it holds), the step, its arguments,
and, among identical calls, which one it is, journaled with its arguments' digest.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from durably import codec, journal, replay

_blake2b = hashlib.blake2b
_current_task = asyncio.current_task


class StepKeys:
    """The keys of one run's step calls, and what they are made of."""

    __slots__ = ("_by_seq", "_calls", "_replayer", "_root", "_used", "by_root", "workflow_id")

    def __init__(self, workflow_id: str, replayer: replay.Replayer) -> None:
        self.workflow_id = workflow_id
        self._replayer = replayer
        # a journal begun before 0013 keeps the keys its steps had then: by seq
        self._by_seq = replayer.begun_before_follows
        self._root = 0  # the id of the task that runs the workflow function (0: none)
        self._calls = 0  # the durable calls that task has made
        self._used: dict[tuple[int, str, str | None], set[int]] = {}
        #: Whether the last call counted was the workflow function's own task's.
        self.by_root = True

    def bind(self) -> None:
        """The calling task runs the workflow function; others are its branches."""
        self._root = id(_current_task())

    def own(self) -> bool:
        """Whether the calling task is the workflow function's own."""
        return self._root == 0 or id(_current_task()) == self._root

    def count(self) -> None:
        """Count a durable call made now (of any kind), by whichever task makes it."""
        self.by_root = self.own()
        if self.by_root:
            self._calls += 1

    def key(self, seq: int, after: int, name: str, digest: str | None) -> tuple[str, str | None]:
        """The key of the step call just counted at ``seq``, and the ``args_digest`` its
        entries carry. ``after``: the seq of the call its task made before it."""
        if self._by_seq:
            return f"{self.workflow_id}:{seq}", digest
        if self.by_root:
            return f"{self.workflow_id}:{self._calls}", digest
        twin = self._twin(seq, after, name, digest)
        which = _blake2b(f"{name}\0{digest}\0{twin}".encode(), digest_size=6).hexdigest()
        return f"{self.workflow_id}:{after}.{which}", journal.twinned(digest, twin)

    def _twin(self, seq: int, after: int, name: str, digest: str | None) -> int:
        """Which of the identical calls after ``after`` this is: the journal's own at
        ``seq``, or the first one neither the journal recorded nor this run made."""
        used = self._used.setdefault((after, name, digest), set())
        entry = self._replayer.peek(seq)
        if entry is not None and entry.kind == journal.Kind.STEP and entry.name == name:
            recorded, twin = journal.twin_of(entry.args_digest)
            if recorded == digest and twin:  # twin 0: the workflow's own call, not a branch's
                used.add(twin)
                return twin
        taken = self._replayer.twins(after, name, digest) if self._replayer.matching else ()
        twin = 1
        while twin in used or twin in taken:
            twin += 1
        used.add(twin)
        return twin


def args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A short digest of a step call's encoded arguments (keywords in name order).

    Journaled with the step and compared when it is replayed. None for
    arguments that cannot be encoded (a client object, say): those are not checked
    (a branch's step journals ``partial_digest`` instead: its key is made of it).
    """
    value: list[Any] = list(args)
    if kwargs:  # positional only (the usual call) encodes a plain list: the fast path
        value = [value, dict(sorted(kwargs.items()))]
    try:
        text = codec.encode(value, where="step arguments")
    except Exception:
        return None
    # encode refuses lone surrogates, so the text is valid UTF-8
    return _blake2b(text.encode(), digest_size=8).hexdigest()


def partial_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``args_digest`` of arguments some of which cannot be encoded: each such one
    stands as its class, so calls that differ in the others still differ (a branch's
    step given a client and an order id is keyed by the order id)."""
    parts: list[Any] = [_part(a) for a in args]
    if kwargs:
        parts.append({k: _part(v) for k, v in sorted(kwargs.items())})
    text = codec.encode(parts, where="step arguments")
    return _blake2b(text.encode(), digest_size=8).hexdigest()


def _part(value: object) -> str:
    """One argument's JSON text, or ``!`` and its class (no JSON text begins so)."""
    try:
        return codec.encode(value, where="step arguments")
    except Exception:
        cls = type(value)
        return f"!{cls.__module__}.{cls.__qualname__}"
