"""What the application sees while an agent runs: text deltas and tool start/end events.

``await agent.run(input, on_event=callback)`` calls ``callback(event)`` (a plain
function; keep it quick) with :class:`AgentEvent` values:

- ``text``: a piece of the model's answer. With ``Agent(stream=True)`` the
  pieces arrive while the model step runs, in order; otherwise the turn's text
  comes whole when the turn ends.
- ``tool_start`` / ``tool_end``: a tool call about to run (its arguments) and
  what it returned to the model.

Events are delivered live only. A turn served from the journal (a replay after
a crash or a park) is delivered once, whole, with ``replayed=True``, and so are
the tool events of a replayed turn; a turn asked again after a crash is
streamed again. The journal keeps one entry per turn whatever was streamed.
A callback that raises is logged and ignored: it never fails the run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("durably.agents")


@dataclasses.dataclass(frozen=True, slots=True)
class AgentEvent:
    """One thing that happened in an agent run, for the application to show."""

    kind: str  # "text", "tool_start" or "tool_end"
    text: str = ""
    tool: str | None = None
    call_id: str | None = None
    arguments: dict[str, Any] | None = None
    result: str | None = None
    replayed: bool = False
    turn: int = 0


EventCallback = Callable[[AgentEvent], Any]


def emit(callback: EventCallback | None, event: AgentEvent) -> None:
    """Deliver ``event``; a failing callback is logged, never raised into the run."""
    if callback is None:
        return
    try:
        callback(event)
    except Exception:
        log.exception("an on_event callback raised on %s; ignored", event.kind)


def delta_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chunk adds: a chat completion chunk's (first choice), or an
    Anthropic ``content_block_delta`` event's ``text_delta``; else ""."""
    if "type" in chunk and "choices" not in chunk:  # an Anthropic server-sent event
        delta = chunk.get("delta") or {}
        is_text = chunk["type"] == "content_block_delta" and delta.get("type") == "text_delta"
        return str(delta.get("text") or "") if is_text else ""
    choices = chunk.get("choices") or ()
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    return str(delta.get("content") or "")
