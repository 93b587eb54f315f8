"""One exception tree for everything durably raises.

Every class's docstring says what is so; its first line is the message of an
error raised without one (``raise errors.EngineNotOpen()``). Callers pass a
specific message that says what went wrong and where.
"""

from __future__ import annotations


class DurablyError(Exception):
    """Base class of every error raised by durably."""

    def __str__(self) -> str:
        if self.args:
            return super().__str__()
        return default_message(type(self))


def default_message(cls: type[BaseException]) -> str:
    """The first line of the class's docstring: what its error means when no message says more."""
    doc = cls.__doc__ or cls.__name__
    return doc.strip().splitlines()[0]


# --- workflow outcomes -------------------------------------------------------


class NonDeterminismError(DurablyError):
    """The code asked for a different durable call than the journal recorded.

    The workflow is marked ``diverged`` and nothing more of it runs. The message
    names the seq, the recorded call and the code's, the file and line of the
    code's call (``site``, the user's call site when it is known), and the code
    each came from: ``recorded_code`` the version or source hash the workflow
    started with, ``asked_code`` today's.
    """

    def __init__(
        self,
        workflow_id: str,
        seq: int,
        recorded: str | None,
        asked: str | None,
        site: str | None = None,
        recorded_code: str | None = None,
        asked_code: str | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self.seq = seq
        self.recorded = recorded
        self.asked = asked
        self.site = site
        self.recorded_code = recorded_code
        self.asked_code = asked_code
        super().__init__(workflow_id, seq, recorded, asked, site, recorded_code, asked_code)

    def __str__(self) -> str:
        recorded = self.recorded or "nothing"
        if self.recorded_code:
            recorded += f" (under {self.recorded_code})"
        asked = self.asked or "nothing (it returned)"
        if self.site:
            asked += f" at {self.site}"
        if self.asked_code:
            asked += f" (under {self.asked_code})"
        return (
            f"workflow {self.workflow_id!r} diverged from its journal at seq {self.seq}: "
            f"the journal recorded {recorded}, the code asked for {asked}"
        )


class ArgumentsChanged(NonDeterminismError):
    """A replayed step was called with other arguments than the journal recorded.

    Raised (the workflow ends ``diverged``) only under ``Engine(strict_replay=True)``;
    otherwise the change is a warning in the log and on the workflow, and the
    recorded result is returned as before.
    """

    def __str__(self) -> str:
        site = f" at {self.site}" if self.site else ""
        code = ""
        if self.recorded_code or self.asked_code:
            code = (
                f" (recorded under {self.recorded_code or 'unknown code'}, "
                f"replayed under {self.asked_code or 'unknown code'})"
            )
        return (
            f"workflow {self.workflow_id!r} seq {self.seq}: {self.asked}{site} was called "
            f"with other arguments than the journal recorded ({self.recorded}){code}; "
            "the recorded result belongs to the old arguments"
        )


class NondeterministicWait(DurablyError, RuntimeError):
    """A first-to-finish ``asyncio.wait`` was called in workflow code; use ``durably.wait``.

    Which awaitable finishes first differs when the workflow is replayed (every
    journaled call then finishes at once); ``durably.wait`` and
    ``durably.wait_first`` journal the outcome instead.
    """


class RecordedValueMismatch(NonDeterminismError):
    """A value the journal recorded no longer decodes into the type the code declares today.

    The workflow is marked ``diverged``, not failed: deploy code whose type takes
    the stored value (or that keeps the old class), then ``resume`` it. The
    message names the seq, the call, the stored value's shape and today's type.
    """

    def __init__(
        self,
        workflow_id: str,
        seq: int,
        recorded: str | None,
        stored: str = "",
        expected: str = "",
        reason: str = "",
    ) -> None:
        super().__init__(workflow_id, seq, recorded, None)
        self.stored = stored
        self.expected = expected
        self.reason = reason
        self.args = (workflow_id, seq, recorded, stored, expected, reason)

    def __str__(self) -> str:
        into = "" if self.expected == "none declared" else f" into today's type {self.expected}"
        return (
            f"workflow {self.workflow_id!r} diverged from its journal at seq {self.seq}: "
            f"the recorded result of {self.recorded} does not decode{into}: "
            f"{self.reason}; stored value: {self.stored}. Deploy code whose "
            f"type accepts it (or that keeps the old class), then resume the workflow "
            f"(durably resume {self.workflow_id} --no-wait, for a worker with that code)"
        )


class StepError(DurablyError):
    """A recorded step error whose original exception type cannot be rebuilt.

    Carries the original type name, message and traceback text so nothing the
    journal holds is lost.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(type_name, message, traceback_text)

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class StepTimeout(DurablyError):
    """A step attempt ran longer than its ``timeout``."""


class Cancelled(DurablyError):
    """The workflow was cancelled; raised at its next durable call."""


class Superseded(Cancelled):
    """A debounced enqueue was superseded by a later one with the same key; it never ran.

    Its workflow ends ``cancelled``; awaiting its result raises this, naming the later one.
    """


class ResolvedAsFailed(DurablyError):
    """A person resolved a step under review as failed; the message says who and why."""


class NothingToResolve(DurablyError):
    """No step awaits a decision there (or it was decided already)."""


class AlreadyResolved(NothingToResolve):
    """Someone else decided that step first; the message says who decided what, and when."""


class WorkflowFailed(DurablyError):
    """A workflow ended ``failed`` and its error could not be re-raised as is."""


# --- payloads ----------------------------------------------------------------


class EncodeError(DurablyError, TypeError):
    """A value cannot be stored as a JSON payload."""


class DecodeError(DurablyError, ValueError):
    """A stored payload is corrupt or names a type that is not allowed."""


class PayloadTooDeep(DecodeError):
    """A JSON payload nests arrays and objects deeper than ``durably serve`` decodes.

    Python's decoder follows about a thousand levels, and only as many as the stack
    has room for, so a value decoded near that may fail where it is encoded again or
    rendered: the server shows such a payload as its text (the API) or says it is not
    shown (the dashboard), and refuses one a person types.
    """


class IncompatibleValue(DecodeError):
    """A stored value fits neither the class stored with it nor the type declared today."""

    def __init__(
        self, message: str = "", *, stored: str = "", expected: str = "", reason: str = ""
    ) -> None:
        super().__init__(*([message] if message else []))
        self.stored = stored
        self.expected = expected
        self.reason = reason


class InvalidName(DurablyError, ValueError):
    """A name or id cannot be stored: not a string, a NUL character, or not UTF-8.

    Raised at the call that was given it (a step, signal, event or queue name,
    a workflow id or name, an idempotency key), before anything is committed.
    """


# --- workflows and registry -------------------------------------------------


class WorkflowNotFound(DurablyError, LookupError):
    """No workflow with that id exists in the database."""


class WorkflowFinished(DurablyError):
    """The workflow has ended, so what was sent to it can never be received (a signal)."""


class WorkflowNotFinished(DurablyError):
    """The workflow has not finished, so it is not removed (``delete`` without ``force``)."""


class WorkflowHasUnfinishedChildren(WorkflowNotFinished):
    """A child of the workflow has not finished, so the workflow is not removed.

    A workflow is deleted with its children; a child still running or parked would
    go too (``delete`` without ``force``). The message names the child.
    """


class WorkflowIdConflict(DurablyError):
    """The workflow id is already taken by a different workflow."""


class WorkflowNotRegistered(DurablyError, LookupError):
    """The journal names a workflow whose code is not imported in this process."""


class WorkflowArgumentsError(DurablyError, TypeError):
    """The arguments given to start a workflow do not fit its function's signature.

    Raised before anything is committed, instead of a workflow that fails at once.
    """


class QueueOptionError(DurablyError, ValueError):
    """An enqueue's options do not fit its queue: a partitioned queue without a
    ``partition_key`` (or a key on a queue that is not partitioned), or ``debounce``
    without a ``delay``."""


class DefinitionError(DurablyError, TypeError):
    """A decorator was applied to something it cannot make durable."""


class NotInWorkflow(DurablyError, RuntimeError):
    """A workflow-only call was made outside a running workflow."""


class NotResumable(DurablyError):
    """The workflow cannot be resumed as it is (not failed, cancelled or diverged, or
    steps ran after its cancellation); the message says why and what to do instead."""


class NotForkable(DurablyError):
    """A fork's prefix would copy a step whose outcome is open (an intent without its
    receipt, or a retry to come): in the fork its idempotency key would be another. The
    message names the step and seq, and what to do instead."""


class EngineNotOpen(DurablyError):
    """The engine is not open; use ``async with Engine(...)``."""


class ServerConfigError(DurablyError):
    """``durably serve`` cannot start as configured (no token off loopback, a bad token file)."""


class RequestTooLarge(DurablyError):
    """The request body is larger than ``durably serve`` accepts (its ``max_body_bytes``).

    Raised while the body is read, as soon as it is known to be too large: the server
    answers 413 and reads no more of it.
    """


# --- storage -------------------------------------------------------------------


class DatabaseURLError(DurablyError):
    """The database URL cannot be used: an unknown scheme, or a malformed part or option.

    Raised before anything is opened; the message quotes the URL (password redacted).
    """


class BackendNotInstalled(DurablyError):
    """The database URL needs a driver that is not installed (psycopg for PostgreSQL)."""


class NotAFinishedStatus(DurablyError):
    """Only finished workflows are pruned; the status asked for is not a final one."""


class BackupError(DurablyError):
    """The backup file cannot be created (durably never overwrites a file)."""


class StoreError(DurablyError):
    """The database could not do what was asked."""


class NotADurablyDatabase(StoreError):
    """The file exists but is not a durably database."""


class DatabaseLocked(StoreError):
    """The database stayed locked by another process past the busy timeout."""


class TransactionConflict(DatabaseLocked):
    """PostgreSQL undid the call's transaction to end a deadlock (or a serialization
    failure) with another one, again and again: each time nothing of it was written, and
    the store ran it again alone before raising this (``StoreThread``)."""


class DatabaseReadOnly(StoreError):
    """The database cannot be written (file permissions or a read-only mount)."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached or opened."""


class DatabaseNotFound(DatabaseUnavailable):
    """A database opened without ``create`` (a reader) does not exist or holds no durably
    schema: a mistyped path is reported, not answered with a new empty database."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer durably than this one."""


class StorageFull(StoreError):
    """The database has no room to write: its disk, quota or file-size limit is full.

    Transient for the engine: a run backs off and tries the same write again
    (space may come back) instead of giving the workflow up and running its
    step again; the message names the database and what is full.
    """


class StorageDataError(StoreError):
    """The database refused a value (PostgreSQL data or integrity error, SQLite constraint).

    Permanent for that value: writing it again fails the same way, so the step
    or workflow that produced it fails with this error instead of running again.
    """


class ArchiveError(StoreError):
    """An archive cannot be read or imported; the message names the file and line.

    Nothing of it was imported.
    """


class BackupNotSupported(StoreError):
    """This database cannot be backed up by durably; the message gives the procedure."""


class FencedError(StoreError):
    """This executor lost its lease: another executor owns the workflow now.

    The write was rejected by the store; the caller must stop touching the
    workflow.
    """


# --- agents -------------------------------------------------------------------


class ToolError(DurablyError):
    """Raise it from a tool to tell the model the call failed.

    The message becomes the tool's result (``{"error": message}``) and the agent
    goes on; any other exception from a tool fails the workflow.
    """


class ApprovalRejected(DurablyError):
    """A person rejected (or a timeout rejected) an approval-gated tool call.

    Raised by a *direct* call of a gated tool; an agent's call instead tells the
    model why, as the tool's result.
    """

    def __init__(self, tool: str, by: str, reason: str) -> None:
        super().__init__(tool, by, reason)
        self.tool, self.by, self.reason = tool, by, reason

    def __str__(self) -> str:
        return f"rejected by {self.by}: {self.reason}" if self.reason else f"rejected by {self.by}"


class ApprovalError(DurablyError):
    """A decision on an approval could not be sent."""


class ApprovalNotPending(ApprovalError, LookupError):
    """No approval of that workflow (and tool call) waits for a decision."""


class ApprovalStale(ApprovalError):
    """The approval now pending is not the one the decision was made on.

    The arguments shown to the person differ from the ones the workflow waits
    on, so the decision is refused rather than applied to something unseen.
    """


class ApprovalAlreadyDecided(ApprovalError):
    """A decision for this approval was already sent; each is made once."""


class MaxTurnsExceeded(DurablyError):
    """The agent used ``max_turns`` model calls without reaching a final answer."""


class ModelResponseError(DurablyError):
    """The model's response cannot be used (no choices, or no message)."""


class OutputValidationError(DurablyError):
    """The model's final answers did not fit the agent's ``output_type`` within its retries."""


class BudgetExceeded(DurablyError):
    """A run's model budget (``max_cost=`` / ``max_tokens=``) was reached and not raised."""
