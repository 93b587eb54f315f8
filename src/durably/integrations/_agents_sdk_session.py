"""A session of the OpenAI Agents SDK (``Runner.run(session=...)``) made durable.

The SDK reads a run's history from its session when the run begins and adds the
run's items to it as it goes. A replay runs ``Runner.run`` again from the top:
it would read a history that now holds what the first run added, send it to the
model, and add every item again. :class:`DurableSession` makes each of the
session's calls a step (``session:get_items``, ``session:add_items``,
``session:pop_item``, ``session:clear_session``): a replay reads the history the
first run read, and writes nothing the first run wrote. As any step, a write cut
by a crash before its receipt runs again (at-least-once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agents.items import TResponseInputItem
from agents.memory import OpenAIConversationsSession, Session

from durably import errors, steps


class DurableSession:
    """A ``Session`` whose every call is a step of the running workflow."""

    def __init__(self, inner: Session) -> None:
        self._inner = inner
        self.session_id = inner.session_id
        self.session_settings = getattr(inner, "session_settings", None)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, as the first run read it."""
        read: list[TResponseInputItem] = await steps.run_step(
            self._inner.get_items, limit, name="session:get_items"
        )
        return read

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Add ``items``, once."""
        await _step(self._inner.add_items, items, name="session:add_items")

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, once."""
        popped: TResponseInputItem | None = await steps.run_step(
            self._inner.pop_item, name="session:pop_item"
        )
        return popped

    async def clear_session(self) -> None:
        """Remove every item, once."""
        await _step(self._inner.clear_session, name="session:clear_session")

    def __repr__(self) -> str:
        return f"<durable session {self.session_id!r} over {type(self._inner).__name__}>"


def _step(fn: Callable[..., Awaitable[Any]], *args: Any, name: str) -> Awaitable[Any]:
    return steps.run_step(fn, *args, name=name)


def durable(session: Any) -> DurableSession | None:
    """``session`` made durable (None stays None); refuses one it cannot keep whole.

    An ``OpenAIConversationsSession`` keeps the conversation on OpenAI's side and
    the SDK treats it apart (by its type); a session that compacts its history
    (``run_compaction``) rewrites it in ways of its own: wrapped, both would lose
    what makes them what they are, so they are refused rather than changed quietly.
    """
    if session is None or isinstance(session, DurableSession):
        return session
    if isinstance(session, OpenAIConversationsSession) or hasattr(session, "run_compaction"):
        raise errors.DefinitionError(
            f"DurableRunner: a session of type {type(session).__name__} cannot be made "
            "durable (it keeps or compacts its history outside the session's calls); use "
            "a session that stores items, such as SQLiteSession, or the workflow's journal"
        )
    if not isinstance(session, Session):
        raise errors.DefinitionError(
            f"DurableRunner: session= takes an agents Session, got {type(session).__name__}"
        )
    return DurableSession(session)
