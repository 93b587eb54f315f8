"""The JSON shapes the API returns and the dashboard renders, built from the Client's records.

One place turns a workflow row, a journal entry, a review or an approval into
plain data, so the API and the pages cannot disagree. The timeline is
:func:`durably.receipts.receipts` (what ``durably show`` prints) with each
row's label, duration, preview and model usage added.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from durably import errors, journal, receipts
from durably.agents import approvals as approvals_module
from durably.agents import usage as agent_usage

PREVIEW = 120
#: The longest payload a preview decodes, looking for a value the codec tagged (a
#: datetime, a UUID: far shorter); a model's answer is not decoded for one line.
_TAGGED = 200
# Calls that record a value and take no time worth showing.
_INSTANT = frozenset({"now", "random", "uuid4", "event", "child", "cancel"})
# Values the engine journals for its own replay: shown quieter than the work itself.
_QUIET = frozenset({"now", "random", "uuid4", "event", "patch"})
# Entries whose payload is the error of a failed attempt.
_ERRORED = frozenset({journal.EntryStatus.FAILED, journal.EntryStatus.RETRYING})


#: The deepest nesting of arrays and objects a payload is decoded with. Deeper, the API
#: gives its text and a page says it is not shown (errors.PayloadTooDeep): json follows
#: only as many levels as the stack has room for, and a 500 is no answer.
MAX_DEPTH = 500
#: What a page shows instead of a payload nested deeper than MAX_DEPTH.
TOO_DEEP = "(not shown: JSON nested more than {depth} levels deep, {size:,} characters)"
#: The same, for a value read already decoded (an approval's arguments): no text to measure.
TOO_DEEP_VALUE = TOO_DEEP.split(",")[0] + ")"


def decode(text: str) -> Any:
    """A JSON text as a value: ValueError when it is not JSON, errors.PayloadTooDeep when
    it nests deeper than MAX_DEPTH (walked only when it has that many brackets)."""
    try:
        value = json.loads(text)
    except RecursionError:  # nested deeper than the decoder follows on this stack
        raise errors.PayloadTooDeep(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise errors.PayloadTooDeep(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value``'s lists and dicts nest more than ``limit`` deep (walked without
    recursion: it is the recursion this guards against)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def payload(text: str | None) -> Any:
    """A stored JSON payload as a value; its text when it is not plain JSON or is nested
    deeper than MAX_DEPTH (an API client gets the stored text, the request no 500)."""
    if text is None:
        return None
    try:
        return decode(text)
    except ValueError:  # errors.PayloadTooDeep too
        return text


def typed(text: str) -> Any:
    """What a person typed as JSON, as a value (the text itself when it is not JSON), as
    the API takes a body: errors.PayloadTooDeep when nested deeper than the decoder
    follows, refused rather than taken as text."""
    try:
        return json.loads(text)
    except RecursionError:
        raise errors.PayloadTooDeep("the JSON typed is nested too deep to decode") from None
    except ValueError:
        return text


def workflow(info: journal.WorkflowInfo) -> dict[str, Any]:
    """A workflow row, with its input and outcome as values."""
    data = dataclasses.asdict(info)
    for key in ("input", "output", "error"):
        data[key] = payload(data[key])
    data["finished"] = info.finished
    return data


def entry(e: journal.Entry) -> dict[str, Any]:
    """A journal entry, its payload as a value."""
    data = dataclasses.asdict(e)
    data["payload"] = payload(e.payload)
    data["duration"] = e.duration
    return data


def review(r: journal.Review) -> dict[str, Any]:
    """A review item, its intent and outcome as values."""
    data = dataclasses.asdict(r)
    data["intent"] = payload(r.intent)
    data["outcome"] = payload(r.outcome)
    return data


def approval(p: approvals_module.PendingApproval) -> dict[str, Any]:
    """A pending approval, with the signal it waits on and its call as one line.

    Arguments nested deeper than MAX_DEPTH (decoded, as deep as the codec writes) are
    replaced by a note, and its call by ``tool(…)``: shown, copied or encoded again they
    would take the whole list down with them (a RecursionError, a 500). The approval is
    listed all the same, with its ``args_sha256``, to be decided.
    """
    data = {field.name: getattr(p, field.name) for field in dataclasses.fields(p)}
    if _deeper_than(p.arguments, MAX_DEPTH):
        data["arguments"] = TOO_DEEP_VALUE.format(depth=MAX_DEPTH)
        return {**data, "signal": p.signal, "call": f"{p.tool}(…)"}
    return {**data, "signal": p.signal, "call": p.describe()}


def executor(e: journal.ExecutorInfo, now: float) -> dict[str, Any]:
    """An executor, with the seconds since its last heartbeat."""
    return {**dataclasses.asdict(e), "heartbeat_age": max(0.0, now - e.heartbeat_at)}


def timeline(
    entries: Sequence[journal.Entry],
    claims: Sequence[journal.Claim],
    *,
    before: Sequence[journal.Entry] = (),
    after: Sequence[journal.Entry] = (),
    to_end: bool = True,
) -> list[dict[str, Any]]:
    """The receipts of ``durably show`` as data: each entry or a gap where the process was dead.

    Entries written before the last recovery were replayed, not run again, by
    the executor that recovered the workflow; they are marked ``replayed``.
    ``entries`` may be a page of the journal (``before``, ``after``, ``to_end``: as
    :func:`durably.receipts.receipts` takes them).
    """
    recovered = [c.claimed_at for c in claims if c.reason == "recovery"]
    last_recovery = max(recovered, default=None)
    rows: list[dict[str, Any]] = []
    for row in receipts.receipts(entries, claims, before=before, after=after, to_end=to_end):
        if isinstance(row, receipts.Gap):
            rows.append(
                {
                    "gap": True,
                    "seconds": row.seconds,
                    "text": row.line().strip("- "),
                    "owner": row.claim.owner,
                    "previous_owner": row.claim.previous_owner,
                }
            )
            continue
        written = row.finished_at or row.started_at or 0.0
        tokens = _usage_of(row)
        rows.append(
            {
                "gap": False,
                "seq": row.seq,
                "kind": row.kind,
                "label": receipts.label(row),
                "status": row.status,
                "attempt": row.attempt,
                "duration": row.duration if row.kind not in _INSTANT else None,
                "preview": _row_preview(row),
                "tokens": tokens.tokens if tokens else None,
                "cost": tokens.cost if tokens else None,
                "replayed": last_recovery is not None and written < last_recovery,
                "quiet": row.kind in _QUIET,
            }
        )
    return rows


def journal_document(
    entries: Sequence[journal.Entry],
    claims: Sequence[journal.Claim],
    *,
    calls: Sequence[journal.Entry] | None = None,
    before: Sequence[journal.Entry] = (),
    after: Sequence[journal.Entry] = (),
    to_end: bool = True,
) -> dict[str, Any]:
    """What ``durably show --json`` and the API's history route both return about a
    journal: its timeline, usage line, entries and claims. ``entries`` may be a page of
    it (``before``, ``after``, ``to_end``: as :func:`timeline` takes them);
    ``calls`` are then the
    whole journal's model calls, which the usage line sums (without, ``entries``')."""
    return {
        "timeline": timeline(entries, claims, before=before, after=after, to_end=to_end),
        "usage": usage_line(entries if calls is None else calls, claims),
        "entries": [entry(e) for e in entries],
        "claims": [dataclasses.asdict(c) for c in claims],
    }


def readable_preview(text: str | None, width: int = PREVIEW) -> str:
    """A one-line preview of a journaled payload; a value the codec tagged (a datetime,
    a UUID) shows as its text rather than as the tag."""
    value = payload(text) if text is not None and len(text) <= _TAGGED else None
    if isinstance(value, dict) and isinstance(value.get("__durably__"), str):
        shown = value.get("iso") or value.get("hex")
        if isinstance(shown, str):
            return shown
    return receipts.preview(text, width)


def failure(text: str | None) -> dict[str, str] | None:
    """An error as ``codec.encode_error`` stored it (a failed workflow's, a failed
    attempt's), as its parts: ``type`` (a builtin's without ``builtins.``), ``message``,
    ``traceback`` (its text, whole) and ``headline`` (``"ValueError: message"``). None
    when ``text`` is no such record."""
    value = payload(text) if text is not None else None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return None
    message, trace = value.get("message"), value.get("traceback")
    if not isinstance(message, str) or not isinstance(trace, str | None):
        return None
    kind = value["type"].removeprefix("builtins.")
    headline = f"{kind}: {message}" if message else kind
    return {"type": kind, "message": message, "traceback": trace or "", "headline": headline}


def _row_preview(row: journal.Entry) -> str:
    """A timeline row's output: a failed attempt's error as ``Type: message``."""
    failed = failure(row.payload) if row.status in _ERRORED else None
    if failed is not None:
        return receipts.preview(failed["headline"], PREVIEW)
    return readable_preview(row.payload)


def _usage_of(row: journal.Entry) -> agent_usage.Tokens | None:
    """The model usage of a timeline row; None for a row that is no model call, or one
    whose answer cannot be decoded (its preview shows its text)."""
    try:
        tokens = agent_usage.usage_from_history([row])
    except errors.DecodeError:
        return None
    return tokens if tokens.calls else None


def usage_line(entries: Sequence[journal.Entry], claims: Sequence[journal.Claim]) -> str | None:
    """What the model calls cost and what recoveries replayed (as ``durably show`` says);
    why not, when an answer cannot be decoded (nested deeper than the decoder follows,
    corrupt): one such call takes no page down with it."""
    recovered = [c.claimed_at for c in claims if c.reason == "recovery"]
    try:
        return agent_usage.recovery_summary(entries, recovered)
    except errors.DecodeError as exc:
        return f"model usage: not shown ({exc})"


def encode_cursor(info: journal.WorkflowInfo) -> str:
    """The opaque cursor of the page after ``info``."""
    raw = json.dumps([info.created_at, info.workflow_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The ``(created_at, workflow_id)`` of a cursor; ValueError names a bad one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, workflow_id = json.loads(raw)
        return float(created_at), str(workflow_id)
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"cursor {cursor!r} is not one this API returned") from exc


def preview_json(text: str | None, width: int = 400) -> str:
    """A stored JSON payload as readable, indented text, cut at ``width`` characters."""
    if text is None:
        return ""
    try:
        value = decode(text)
    except errors.PayloadTooDeep:
        return TOO_DEEP.format(depth=MAX_DEPTH, size=len(text))
    except ValueError:
        value = text
    shown = json.dumps(value, indent=2, ensure_ascii=False) if not isinstance(value, str) else value
    return shown if len(shown) <= width else shown[: width - 1] + "…"
