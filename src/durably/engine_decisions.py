"""The Engine's calls for people's decisions: approvals of tool calls and reviews of steps.

Each is a plan shared with the Client (``agents.decisions`` for approvals,
:mod:`durably.operations` for reviews), run on the engine's store; after it the
engine wakes its own runs as a signal would. A part of
:class:`~durably.engine.Engine`, kept here so that the engine's module holds its
lifecycle and the run of one workflow.
"""

from __future__ import annotations

from typing import Any, TypeVar

from durably import journal, operations, step_call
from durably.storage import base

R = TypeVar("R")


class Decisions:
    """Engine methods that record a person's decision; the Engine supplies what is declared here."""

    _ops: operations.Operations

    async def _run(self, plan: operations.Plan[R]) -> R:
        raise NotImplementedError

    def _on_wakeup(self, wakeup: base.Wakeup) -> None:
        raise NotImplementedError

    def _kick_recovery(self) -> None:
        raise NotImplementedError

    async def approve(
        self,
        workflow_id: str,
        *,
        by: str,
        tool_call_id: str | None = None,
        expect: Any = None,
        override_args: Any = None,
        note: str = "",
    ) -> Any:
        """Approve the workflow's pending tool call, once, bound to the arguments shown.

        See :func:`durably.agents.approve`; who and when are journaled.
        """
        from durably.agents import decisions

        fields = decisions.fields("approve", by, note, override_args)
        return await self._decide(workflow_id, tool_call_id, expect, fields)

    async def reject(
        self,
        workflow_id: str,
        *,
        by: str,
        reason: str = "",
        tool_call_id: str | None = None,
        expect: Any = None,
    ) -> Any:
        """Reject the workflow's pending tool call; the model reads the reason as its result."""
        from durably.agents import decisions

        fields = decisions.fields("reject", by, reason, None)
        return await self._decide(workflow_id, tool_call_id, expect, fields)

    async def _decide(
        self, workflow_id: str, tool_call_id: str | None, expect: Any, fields: dict[str, Any]
    ) -> Any:
        """Send the decision's signal (see ``decisions.decide_plan``), then wake local runs
        as ``send_signal`` does."""
        from durably.agents import decisions

        plan = decisions.decide_plan(self._ops, workflow_id, tool_call_id, expect, fields)
        decided = await self._run(plan)
        self._on_wakeup(base.Wakeup("signal", workflow_id, decided.signal))
        return decided

    async def list_approvals(
        self, workflow_id: str | None = None, *, limit: int = 1000
    ) -> list[Any]:
        """Tool calls waiting for a person's approval, with their exact arguments."""
        from durably.agents import decisions

        return await self._run(decisions.list_plan(self._ops, workflow_id, limit))

    async def reviews(self, workflow_id: str | None = None) -> list[journal.Review]:
        """Steps parked in ``needs_review``, oldest first, with their intent and key."""
        return await self._run(self._ops.reviews(workflow_id))

    async def resolve(
        self,
        workflow_id: str,
        seq: int,
        *,
        result: Any = step_call.NO_RESULT,
        retry: bool = False,
        fail: str | None = None,
        by: str = "unknown",
        attempt: int | None = None,
    ) -> journal.Review:
        """Decide a parked step once: its ``result``, ``retry=True`` or ``fail="reason"``.

        ``attempt`` names the review decided (``Review.attempt``, as listed): a decision
        made for an earlier review at that seq raises AlreadyResolved and changes
        nothing. Without it, the review open there now is decided.
        Who decided and when are journaled; the workflow then resumes.
        """
        plan = self._ops.resolve(workflow_id, seq, result, retry, fail, by, attempt)
        review = await self._run(plan)
        self._kick_recovery()
        return review
