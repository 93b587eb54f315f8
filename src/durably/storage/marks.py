"""Marks on store verbs that tell the store thread and a dialect how to run them.

A verb is marked where it is defined (``@marks.alone``, ``@marks.one_read``,
``@marks.ends_with("...")``) and the marks are read, bound or not, on every store call
(``runs_alone``, ``is_one_read``, ``ending_verb``): what may share a transaction with
other workflows' verbs, and what a dialect may send without BEGIN and COMMIT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_Verb = TypeVar("_Verb", bound=Callable[..., Any])


def alone(verb: _Verb) -> _Verb:
    """Mark a verb that may lock the rows of many workflows at once (or of a workflow
    another run holds): a store with several threads runs it in a transaction of its own
    while no other batch is in flight, so it never waits in a cycle with one of them
    (PostgreSQL would break such a cycle after a second by failing one side)."""
    verb.runs_alone = True  # type: ignore[attr-defined]
    return verb


def _marked(fn: Callable[..., Any], mark: str, default: Any) -> Any:
    """The ``mark`` a verb (bound or not) was given, else ``default``.

    Looked up on the function itself: a bound method passes a missing attribute on to
    its function by raising and catching AttributeError, 7x dearer than the lookup, and
    every store call asks for its verb's marks.
    """
    return getattr(getattr(fn, "__func__", fn), mark, default)


def runs_alone(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a verb, bound or not) is marked with :func:`alone`."""
    return bool(_marked(fn, "runs_alone", False))


def one_read(verb: _Verb) -> _Verb:
    """Mark a verb that only reads, in exactly one statement: alone in its batch, a
    dialect whose every statement is a round trip sends it without BEGIN and COMMIT (a
    statement on its own is a transaction, with a snapshot of its own)."""
    verb.one_read = True  # type: ignore[attr-defined]
    return verb


def is_one_read(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a verb, bound or not) is marked with :func:`one_read`."""
    return bool(_marked(fn, "one_read", False))


def ends_with(verb: str) -> Callable[[_Verb], _Verb]:
    """Mark a function of verbs (an op that is not one verb) with the verb it calls last
    whenever it calls it, a promise: alone in its batch, a store may send that verb's
    statement with COMMIT (``pg_statements.OneStatementVerbs._ending``), and refuses any
    statement after it."""

    def mark(fn: _Verb) -> _Verb:
        fn.ends_with = verb  # type: ignore[attr-defined]
        return fn

    return mark


def ending_verb(fn: Callable[..., Any]) -> str | None:
    """The verb ``fn`` promises to call last (:func:`ends_with`), if any."""
    ending: str | None = _marked(fn, "ends_with", None)
    return ending
