"""``@durably.workflow`` and the journaled calls made inside one.

The decorator records the workflow in a process-wide registry by name, so an
engine can resume it from storage after a restart. Its body is ordinary async
code that must make the same durable calls in the same order on every run;
``now()``, ``random()`` and ``uuid4()`` are journaled so that holds.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import inspect
import os
import random as _random
import threading
import uuid as _uuid
from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, TypeVar, overload

from durably import context, errors, journal, validate, workflow_run

P = ParamSpec("P")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A workflow's function, name and version."""

    fn: Callable[..., Coroutine[Any, Any, Any]]
    name: str
    version: str | None
    source_hash: str | None
    max_recoveries: int | None = None  # crashes in a row a run may survive; None: the engine's
    timeout: float | None = None  # seconds from its start to its deadline; None: no deadline

    @property
    def origin(self) -> str:
        """Where the function is defined: ``module:qualname``."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"


_registry: dict[str, WorkflowDefinition] = {}


def registered(name: str) -> WorkflowDefinition | None:
    """The workflow registered under name in this process."""
    return _registry.get(name)


def registered_names() -> list[str]:
    """Every workflow name known to this process."""
    return sorted(_registry)


class WorkflowFunction(Generic[P, R]):
    """A decorated workflow. Start it with an Engine; calling it runs it plainly."""

    def __init__(self, definition: WorkflowDefinition) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return self.definition.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<durably workflow {self.definition.name!r}>"


def _source_hash(fn: Callable[..., Any]) -> str | None:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _register(
    fn: Callable[..., Any],
    name: str | None,
    version: str | None,
    max_recoveries: int | None,
    timeout: float | None = None,
) -> WorkflowFunction[Any, Any]:
    if isinstance(fn, WorkflowFunction):
        raise errors.DefinitionError(f"{fn!r} is already a workflow")
    if not inspect.iscoroutinefunction(fn):
        raise errors.DefinitionError(
            f"@durably.workflow needs an async def; {getattr(fn, '__qualname__', fn)!r} is not"
        )
    definition = WorkflowDefinition(
        fn=fn,
        name=name or fn.__qualname__,
        version=version,
        source_hash=_source_hash(fn),
        max_recoveries=max_recoveries,
        timeout=timeout,
    )
    existing = _registry.get(definition.name)
    if existing is not None and existing.origin != definition.origin:
        raise errors.DefinitionError(
            f"workflow name {definition.name!r} is taken by {existing.origin}; "
            f"give {definition.origin} another name with @durably.workflow(name=...)"
        )
    _registry[definition.name] = definition
    return WorkflowFunction(definition)


@overload
def workflow(fn: Callable[P, Coroutine[Any, Any, R]], /) -> WorkflowFunction[P, R]: ...
@overload
def workflow(
    *,
    name: str | None = None,
    version: str | None = None,
    max_recoveries: int | None = None,
    timeout: float | datetime.timedelta | None = None,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], WorkflowFunction[P, R]]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    max_recoveries: int | None = None,
    timeout: float | datetime.timedelta | None = None,
) -> Any:
    """Make an ``async def`` a durable workflow, registered under ``name`` (default: its qualname).

    With ``version``, recovery resumes it only on code that declares the same
    version; without, any code may resume it and the replay check guards it.
    ``max_recoveries`` overrides the engine's: how many crashes in a row
    (executor deaths mid-run) a run survives before it is failed. ``timeout``
    (seconds, from its start or enqueue) gives each run a deadline, stored
    with it: past it, the workflow and its children are cancelled wherever they
    are (see ``Engine.start``; a ``timeout`` given there wins).
    """
    if name is not None:
        validate.name(name, "workflow name")
    if version is not None:
        validate.name(version, "workflow version")
    if max_recoveries is not None:
        validate.count(
            max_recoveries, "workflow(max_recoveries)", low=0, error=errors.DefinitionError
        )
    seconds = None
    if timeout is not None:
        seconds = check_timeout(timeout, "workflow(timeout)", errors.DefinitionError)
    if fn is not None:
        return _register(fn, name, version, max_recoveries, seconds)
    return lambda f: _register(f, name, version, max_recoveries, seconds)


def check_timeout(timeout: object, what: str, error: type[Exception] = ValueError) -> float:
    """A workflow's timeout: seconds, more than zero and finite (a timedelta is taken too)."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return validate.number(timeout, what, above=True, error=error)


def new_workflow_id(workflow_id: str | None) -> str:
    """The given id, checked, or a fresh random one when None: a version 4 UUID's hex."""
    if workflow_id is None:
        return random_uuid_hex()
    if not isinstance(workflow_id, str) or not workflow_id.strip():
        raise errors.InvalidName(f"workflow_id must be a non-empty string, got {workflow_id!r}")
    return validate.name(workflow_id, "workflow id")


def random_uuid_hex() -> str:
    """``uuid.uuid4().hex`` without the UUID object (a quarter of its cost on every start):
    16 random bytes with the version (4) and RFC 4122 variant bits set."""
    b = bytearray(_RANDOM.take16())
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()


class _RandomPool:
    """``os.urandom`` read 4 KiB at a time and handed out 16 bytes at a time.

    ``os.urandom`` releases the GIL around its system call, so on the event loop's
    thread each call let a busy store thread take the interpreter, and the loop then
    waited for it back: 8-18 µs a start with 100 workflows in flight, where the call
    alone takes 0.3 (issue 12, sixteenth pass). The bytes are the kernel's, as
    before; a forked child starts with none of its parent's (``os.register_at_fork``),
    so two processes never hand out the same ones.
    """

    SIZE = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0

    def take16(self) -> bytes:
        with self._lock:
            at = self._at
            if at + 16 > len(self._pool):
                self._pool, at = os.urandom(self.SIZE), 0
            self._at = at + 16
            return self._pool[at : at + 16]

    def forget(self) -> None:
        """Drop what is left (in a forked child: its parent hands those out)."""
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        self._pool, self._at = b"", 0


_RANDOM = _RandomPool()
if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_RANDOM.forget)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, read once per function (every start checks its arguments)."""
    try:
        return _signature_of(fn)
    except TypeError:  # an unhashable callable: read it each time
        return _signature_of.__wrapped__(fn)


@functools.lru_cache(maxsize=1024)
def _signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _plain_arity(signature: inspect.Signature) -> int:
    """How many arguments a function of ``signature`` takes when each of its parameters
    is a plain positional one (no default, no ``*args``, no keyword-only): any call with
    that many positional arguments and no keywords binds. -1 when it has another kind
    (``bind`` decides)."""
    params = signature.parameters.values()
    if all(p.kind in _POSITIONAL and p.default is p.empty for p in params):
        return len(signature.parameters)
    return -1


def check_arguments(
    definition: WorkflowDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raise WorkflowArgumentsError unless the function takes these arguments.

    Checked before the start is committed: otherwise the workflow would be
    stored and fail at its first line with a TypeError.
    """
    signature = _signature(definition.fn)
    if signature is None:  # no signature to check against (a builtin, a C function)
        return
    if not kwargs and len(args) == _plain_arity(signature):
        return  # the usual call: every parameter, by position
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        signature = signature.replace(  # names only: annotations may be unresolved strings
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise errors.WorkflowArgumentsError(
            f"workflow {definition.name!r} takes "
            f"{getattr(definition.fn, '__name__', definition.name)}{signature}; "
            f"cannot call it with {len(args)} positional argument(s)"
            + (f" and keywords {', '.join(map(repr, kwargs))}" if kwargs else "")
            + f": {exc}"
        ) from None


def definition_of(wf: object) -> WorkflowDefinition:
    """The definition behind a decorated workflow or a registered name."""
    if isinstance(wf, WorkflowFunction):
        return wf.definition
    if isinstance(wf, str):
        found = _registry.get(wf)
        if found is None:
            raise errors.WorkflowNotRegistered(
                f"no workflow named {wf!r} is registered in this process "
                f"(known: {', '.join(registered_names()) or 'none'}); import its module first"
            )
        return found
    raise errors.DefinitionError(f"{wf!r} is not a @durably.workflow")


# --- journaled values -------------------------------------------------------------


def now() -> datetime.datetime:
    """The current UTC time, journaled: a replay returns the time of the first run."""
    run = context.require_run("now")
    return run.journal_value(
        journal.Kind.NOW,
        lambda: datetime.datetime.fromtimestamp(run.clock(), datetime.UTC),
    )


def random() -> float:
    """A random float in [0, 1), journaled: a replay returns the same value."""
    return context.require_run("random").journal_value(journal.Kind.RANDOM, _random.random)


def uuid4() -> _uuid.UUID:
    """A random UUID, journaled: a replay returns the same one."""
    return context.require_run("uuid4").journal_value(journal.Kind.UUID4, _uuid.uuid4)


# --- patches ---------------------------------------------------------------------


def patched(change_id: str) -> bool:
    """Whether this workflow takes the new path of the change ``change_id``.

    True for a workflow that reaches this point under code that has the patch
    (a marker is journaled here, so its replays say True too); False for one
    that went past this point under older code (its journal holds the old
    path's calls here, which then replay as recorded). So a fix can be
    deployed under running workflows::

        if durably.patched("refund-in-cents"):
            await refund_cents(order, cents)
        else:
            await refund(order, cents / 100)

    Every call with the same id in one run gives the same answer. Once no
    workflow that went past it under old code is left, replace the branch by
    its new path and the call by ``deprecate_patch(change_id)``.
    """
    run = context.require_run("patched")
    return run.patched(_patch_id(change_id, "patched"))


def deprecate_patch(change_id: str) -> None:
    """Mark where ``patched(change_id)`` was, after its old path is gone.

    Replays both journals made with the patch (steps over its marker) and
    journals made without it (journals nothing), so workflows started under
    either code keep replaying. Remove it once none of those is left.
    """
    run = context.require_run("deprecate_patch")
    run.deprecate_patch(_patch_id(change_id, "deprecate_patch"))


def _patch_id(change_id: object, what: str) -> str:
    """The change id, checked: a non-empty name a database can store."""
    checked = validate.name(change_id, f"durably.{what}() change id")
    if not checked.strip():
        raise errors.InvalidName(f"durably.{what}() needs a non-empty change id, got {checked!r}")
    return checked


def compensate(fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any) -> None:
    """Register an undo for something that succeeded (call it right after the step).

    If the workflow then fails or is cancelled, the registered compensations
    run as durable steps, newest first (by the durable call each was registered
    after, so tasks run at once undo in one order on every replay; undos of such
    tasks registered after the same call, by name and arguments), each exactly
    once across crashes, and the workflow still ends with its original error.
    """
    run = context.require_run("compensate")
    if not callable(fn):
        raise errors.DefinitionError(f"compensate() needs a function, got {type(fn).__name__}")
    label = name or f"compensate:{getattr(fn, '__qualname__', repr(fn))}"
    after, nth = run.undo_order()
    run.compensations.append(workflow_run.Compensation(fn, args, kwargs, label, after, nth))
