"""OpenTelemetry spans for the work durably really does (the optional ``otel`` extra).

What gets a span, and why only real work does:

- ``workflow <name>``: one per execution segment, that is each time a process
  runs the workflow's code (its first run, a resume after a park, a recovery
  after a crash), from the claim to its end, park or loss. It says how many
  journal entries the segment found (``durably.replayed_entries``) and how it
  ended (``durably.outcome``). Steps, model calls and waits are its children.
- ``step <name>``: one per real execution of a step (each attempt). A step
  served from the journal during replay returns before the call is reached,
  so recovering a workflow does not inflate the telemetry.
- ``chat <model>``: one per request to a model provider, inside its model
  step's span, with the GenAI semantic conventions' attributes
  (``gen_ai.system``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``).
- ``sleep``, ``wait signal <name>``, ``wait child <id>``: one per wait, emitted
  when the wait really ends (the time passes, the signal is delivered or times
  out, the child finishes), spanning from when the wait began (kept in the
  journal, so possibly in an earlier process) to then. A wait found already
  over in the journal emits nothing.

Every span carries ``durably.workflow_id``; step, model and wait spans carry
``durably.seq`` as well, steps and model calls ``durably.attempt``.

:class:`LogContextFilter` adds ``workflow_id`` and ``seq`` to log records made
inside a run (see docs/deploying.md). Without ``opentelemetry-api`` installed
(or with no tracer provider set) the spans cost nothing and record nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from durably import context

if TYPE_CHECKING:
    from durably.workflow_run import Run

MODEL_STEP_PREFIX = "llm:"

#: Where ``_trace`` finds OpenTelemetry's trace module, if anything loaded it.
_modules = sys.modules

#: A tracer provider named in the environment, which OpenTelemetry loads on first use.
_PROVIDER_IN_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ

if _PROVIDER_IN_ENV:  # spans are recorded without the application importing OpenTelemetry
    with contextlib.suppress(ImportError):  # the otel extra is not installed
        import opentelemetry.trace  # noqa: F401  (loaded for _trace)


def _trace() -> Any:
    """OpenTelemetry's trace module once something loaded it, else None.

    Not imported here: ``import durably`` would pay 6-7 ms for it. An application
    that records spans has loaded it (a tracer provider is set through it, or named
    in the environment, see above), and until then no span could be recorded.
    """
    return _modules.get("opentelemetry.trace")


def _tracer() -> Any:
    return _trace().get_tracer("durably")


def _tracing() -> bool:
    """True when a span can be recorded: OpenTelemetry is loaded and a global tracer
    provider is set (or named in the environment).

    Without a provider every span is a no-op that still costs a context attach and
    detach and a tracer lookup (10-15 µs, more than the rest of the engine's Python
    for a step on SQLite NORMAL), so step spans are skipped then. It reads
    OpenTelemetry's global ``_TRACER_PROVIDER``, as OpenTelemetry's own ProxyTracer
    does; should that name ever go, spans are always made.
    """
    trace = _modules.get("opentelemetry.trace")  # _trace(), without a call: every step
    return trace is not None and (
        _PROVIDER_IN_ENV or getattr(trace, "_TRACER_PROVIDER", True) is not None
    )


@contextlib.contextmanager
def workflow_span(run: Run, name: str, replayed: int, crash_count: int) -> Iterator[Any]:
    """A span around one execution segment of a workflow (see the module docstring); none
    without OpenTelemetry or a tracer provider (see ``_tracing``)."""
    if not _tracing():
        yield None
        return
    attributes: dict[str, str | int] = {
        "durably.workflow_id": run.workflow_id,
        "durably.workflow": name,
        "durably.epoch": run.epoch,
        "durably.replayed_entries": replayed,
        "durably.crash_count": crash_count,
    }
    with _tracer().start_as_current_span(f"workflow {name}", attributes=attributes) as span:
        try:
            yield span
        finally:
            span.set_attribute("durably.outcome", _outcome(run))


def _outcome(run: Run) -> str:
    """How a segment ended, from the run's own state."""
    state = run.state.name
    if state == "LOST":
        return "lost"  # another process holds the workflow now
    if state == "ABANDONED":
        return "abandoned"  # the database stopped answering
    if run.parked:
        return "parked"
    if run.suspended:
        return "suspended"  # the engine stopped
    return "finished"


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def step_span(
    workflow_id: str, seq: int, step: str, attempt: int
) -> contextlib.AbstractContextManager[Any]:
    """A span around one real execution of a step; yields it (or None without OpenTelemetry
    or without a tracer provider set)."""
    if not _tracing():
        return _NO_SPAN
    return _step_span(workflow_id, seq, step, attempt)


@contextlib.contextmanager
def _step_span(workflow_id: str, seq: int, step: str, attempt: int) -> Iterator[Any]:
    attributes: dict[str, str | int] = {
        "durably.workflow_id": workflow_id,
        "durably.seq": seq,
        "durably.attempt": attempt,
        "durably.step": step,
    }
    with _tracer().start_as_current_span(f"step {step}", attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def model_span(system: str, model: str) -> Iterator[Any]:
    """A span around one request to a model provider (GenAI semantic conventions).

    Called inside a model step's body, which runs only when the journal has no
    answer: a replayed model call has no span.
    """
    trace = _trace()
    if trace is None:
        yield None
        return
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": system,
        "gen_ai.request.model": model,
    }
    step = context.current_step.get()
    if step is not None:
        attributes.update(
            {
                "durably.workflow_id": step.workflow_id,
                "durably.seq": step.seq,
                "durably.attempt": step.attempt,
            }
        )
    kind = trace.SpanKind.CLIENT
    with _tracer().start_as_current_span(f"chat {model}", kind=kind, attributes=attributes) as span:
        yield span


def record_result(span: Any, step: str, result: Any) -> None:
    """Add a model call's model and token counts to its span (GenAI attribute names).

    ``result`` is the response as journaled (chat-completion shaped, whatever
    the provider: see durably.agents.messages_api).
    """
    if span is None or not step.startswith(MODEL_STEP_PREFIX) or not isinstance(result, Mapping):
        return
    usage = result.get("usage")
    if result.get("model"):
        span.set_attribute("gen_ai.response.model", str(result["model"]))
    if isinstance(usage, Mapping):
        for source, name in (
            ("prompt_tokens", "gen_ai.usage.input_tokens"),
            ("completion_tokens", "gen_ai.usage.output_tokens"),
        ):
            if isinstance(usage.get(source), int):
                span.set_attribute(name, usage[source])


def wait_ended(
    workflow_id: str,
    seq: int,
    kind: str,
    key: str,
    began: float | None,
    outcome: str,
    ended: float | None = None,
) -> None:
    """Emit the span of a wait that really ended now (or at ``ended``, when the claim that
    took the workflow received it); it began at ``began`` (Unix seconds).

    ``kind`` is the journal kind (``sleep``, ``signal``, ``join``), ``key`` the
    signal's name or the child's id. Called only where a wait turns final in
    this run or the claim that launched it, never for one the journal already
    holds as final.
    """
    if _trace() is None:
        return
    now = time.time() if ended is None else ended
    start = began if began is not None and began <= now else now
    kind, outcome = str(kind), str(outcome)
    label = {"sleep": "sleep", "signal": f"wait signal {key}", "join": f"wait child {key}"}
    attributes: dict[str, str | int | float] = {
        "durably.workflow_id": workflow_id,
        "durably.seq": seq,
        "durably.wait": kind,
        "durably.wait.outcome": outcome,
    }
    if key:
        attributes["durably.wait.key"] = key
    span = _tracer().start_span(
        label.get(kind, f"wait {kind}"), attributes=attributes, start_time=int(start * 1e9)
    )
    span.end(end_time=int(now * 1e9))


class LogContextFilter(logging.Filter):
    """Adds ``workflow_id`` and ``seq`` to every record it sees (None outside a run).

    Inside a step, ``seq`` is the step's; in workflow code, the seq of the last
    durable call made. Add it to a handler (``handler.addFilter(...)``) so that
    records of every logger reaching that handler carry them, e.g. in a format
    string (``%(workflow_id)s``) or as attributes of OpenTelemetry log records.
    It never drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        workflow_id, seq = where()
        record.workflow_id = workflow_id
        record.seq = seq
        return True


def where() -> tuple[str | None, int | None]:
    """The workflow id and seq of the code running now, or (None, None) outside a run."""
    step = context.current_step.get()
    if step is not None:
        return step.workflow_id, step.seq
    run = context.current_run.get()
    if run is not None:
        return run.workflow_id, run.last_seq
    return None, None
