"""Approval-gated tool calls: park the workflow until a person decides, from any process.

Inside the workflow, a gated call publishes what waits for approval under the
event ``approval:<id>`` (the exact tool name and arguments, and a SHA-256 of
the arguments), adds it to the workflow's ``approvals:pending`` event (the list of
its pending approvals), and waits for the signal ``approval:<id>``; the workflow
parks (``waiting``) and holds no process. ``<id>`` is the model's
``tool_call_id`` (suffixed if a provider reuses one).

Outside, :mod:`durably.agents.decisions` sends the decision as that signal.
The workflow accepts only a decision that carries the hash of the arguments it
published; the consumed signal is journaled, so the decision, who made it and
when are part of the workflow's history.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Coroutine, Sequence
from typing import Any, Literal

from durably import context, waits, workflows
from durably.agents import exceptions

PREFIX = "approval:"
INDEX_EVENT = "approvals:pending"
OnTimeout = Literal["reject", "approve"]
JSON = dict[str, Any]


def args_hash(arguments: Any) -> str:
    """SHA-256 of the arguments as canonical JSON: what binds a decision to what was shown."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a person: exactly what would run if approved."""

    workflow_id: str
    approval_id: str
    tool: str
    arguments: JSON
    args_sha256: str
    tool_call_id: str | None
    requested_at: str
    deadline: str | None

    @property
    def signal(self) -> str:
        """The signal name the workflow waits on."""
        return PREFIX + self.approval_id

    @classmethod
    def from_record(cls, record: JSON) -> PendingApproval:
        """Read one entry of a workflow's ``approvals:pending`` event."""
        return cls(
            workflow_id=str(record["workflow_id"]),
            approval_id=str(record["approval_id"]),
            tool=str(record["tool"]),
            arguments=dict(record.get("arguments") or {}),
            args_sha256=str(record["args_sha256"]),
            tool_call_id=record.get("tool_call_id"),
            requested_at=str(record.get("requested_at") or ""),
            deadline=record.get("deadline"),
        )

    def describe(self) -> str:
        """``refund(order_id='A1', cents=50000)``."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return f"{self.tool}({args})"


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What was decided about one approval, by whom and when."""

    approved: bool
    by: str
    at: str
    reason: str = ""
    override_args: JSON | None = None
    timed_out: bool = False

    def rejection(self) -> str:
        """The text the model reads for a rejection."""
        return exceptions.rejection_text(self.by, self.reason)


# --- inside the workflow ------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Gate:
    """One gated call: the record published, and the decision once made."""

    record: JSON
    timeout: float | None
    on_timeout: OnTimeout
    decision: Decision | None = None

    @property
    def signal(self) -> str:
        return PREFIX + str(self.record["approval_id"])


@dataclasses.dataclass(slots=True)
class _RunApprovals:
    used: set[str] = dataclasses.field(default_factory=set)
    pending: dict[str, JSON] = dataclasses.field(default_factory=dict)


def _state() -> tuple[str, _RunApprovals]:
    run = context.require_run("an approval-gated tool call")
    return run.workflow_id, run.local(_RunApprovals, _RunApprovals)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A gated call to open: the tool, its arguments as shown, and its options."""

    tool: str
    arguments: JSON
    tool_call_id: str | None
    timeout: float | None
    on_timeout: OnTimeout


def open_gates(requests: Sequence[Request]) -> list[Gate]:
    """Publish the approvals (one event each, then the workflow's pending list).

    Synchronous: the events take their seqs now, in the order given.
    """
    if not requests:
        return []
    workflow_id, state = _state()
    now = workflows.now()
    gates = []
    for req in requests:
        base = req.tool_call_id or f"{req.tool}-{workflows.uuid4().hex[:12]}"
        approval_id, n = base, 1
        while approval_id in state.used:
            n += 1
            approval_id = f"{base}#{n}"
        state.used.add(approval_id)
        deadline = None if req.timeout is None else now + datetime.timedelta(seconds=req.timeout)
        record: JSON = {
            "workflow_id": workflow_id,
            "approval_id": approval_id,
            "signal": PREFIX + approval_id,
            "tool": req.tool,
            "arguments": req.arguments,
            "args_sha256": args_hash(req.arguments),
            "tool_call_id": req.tool_call_id,
            "requested_at": now.isoformat(),
            "deadline": None if deadline is None else deadline.isoformat(),
            "status": "pending",
        }
        waits.set_event(PREFIX + approval_id, record)
        state.pending[approval_id] = record
        gates.append(Gate(record, req.timeout, req.on_timeout))
    waits.set_event(INDEX_EVENT, list(state.pending.values()))
    return gates


def decide(gates: Sequence[Gate]) -> Coroutine[Any, Any, list[Decision]]:
    """Wait (durably, in parallel) until every gate has a valid decision or timed out.

    The first waits take their seqs now, in the order of ``gates``. A signal
    that does not carry the hash of the shown arguments is refused (it stays in
    the journal) and its gate waits again for what is left of its timeout.
    """
    timed = any(g.timeout is not None for g in gates)
    now = workflows.now() if timed else None
    deadlines = {
        i: now + datetime.timedelta(seconds=g.timeout)
        for i, g in enumerate(gates)
        if g.timeout is not None and now is not None
    }
    undecided = [i for i, g in enumerate(gates) if g.decision is None]
    return _decide(gates, undecided, deadlines, _waits(gates, undecided, deadlines, now))


def _waits(
    gates: Sequence[Gate],
    which: list[int],
    deadlines: dict[int, datetime.datetime],
    now: datetime.datetime | None,
) -> list[Coroutine[Any, Any, Any]]:
    """One ``wait_for_signal`` per gate in ``which`` (seqs taken now), for what is left."""
    waiting = []
    for i in which:
        left = None
        if i in deadlines and now is not None:
            left = max(0.0, (deadlines[i] - now).total_seconds())
        waiting.append(waits.wait_for_signal(gates[i].signal, timeout=left))
    return waiting


async def _decide(
    gates: Sequence[Gate],
    undecided: list[int],
    deadlines: dict[int, datetime.datetime],
    waiting: list[Coroutine[Any, Any, Any]],
) -> list[Decision]:
    while undecided:
        payloads = await asyncio.gather(*waiting)
        for i, payload in zip(undecided, payloads, strict=True):
            gate = gates[i]
            if payload is None:  # the deadline passed
                approved = gate.on_timeout == "approve"
                at = deadlines[i].isoformat() if i in deadlines else ""
                gate.decision = Decision(approved, "timeout", at, "no decision in time", None, True)
            else:
                gate.decision = read_decision(payload, gate.record)
        undecided = [i for i in undecided if gates[i].decision is None]
        if undecided:
            now = workflows.now() if deadlines else None
            waiting = _waits(gates, undecided, deadlines, now)
    return [g.decision for g in gates if g.decision is not None]


def read_decision(payload: Any, record: JSON) -> Decision | None:
    """The decision a signal carries, or None when it is malformed or for other arguments."""
    if not isinstance(payload, dict) or payload.get("args_sha256") != record["args_sha256"]:
        return None
    kind = payload.get("decision")
    if kind not in ("approve", "reject"):
        return None
    override = payload.get("override_args") if kind == "approve" else None
    return Decision(
        approved=kind == "approve",
        by=str(payload.get("by") or "unknown"),
        at=str(payload.get("at") or ""),
        reason=str(payload.get("reason") or ""),
        override_args=override if isinstance(override, dict) else None,
    )


def close_gates(gates: Sequence[Gate]) -> None:
    """Publish each gate's outcome and the workflow's remaining pending list."""
    if not gates:
        return
    _, state = _state()
    for gate in gates:
        d = gate.decision
        outcome = (
            "timed_out" if d and d.timed_out else "approved" if d and d.approved else "rejected"
        )
        record = {**gate.record, "status": outcome}
        if d is not None:
            record.update(decided_by=d.by, decided_at=d.at, reason=d.reason)
            record.update(override_args=d.override_args)
        waits.set_event(gate.signal, record)
        state.pending.pop(str(gate.record["approval_id"]), None)
    waits.set_event(INDEX_EVENT, list(state.pending.values()))
