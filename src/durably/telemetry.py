"""OpenTelemetry spans for the work durably really does (the optional ``otel`` extra).

One span per real execution of a step (each attempt), and none for a step
served from the journal: replay returns before the call is reached, so
recovering a workflow does not inflate the telemetry. Each span carries the
workflow id, seq, attempt and step name; a model-call step (``llm:...``)
carries the GenAI semantic conventions' model and token counts as well.
Without ``opentelemetry-api`` installed (or with no tracer provider set) this
costs nothing and records nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

MODEL_STEP_PREFIX = "llm:"


@contextlib.contextmanager
def step_span(workflow_id: str, seq: int, step: str, attempt: int) -> Iterator[Any]:
    """A span around one real execution of a step; yields it (or None without OpenTelemetry)."""
    if trace is None:
        yield None
        return
    tracer = trace.get_tracer("durably")
    attributes: dict[str, str | int] = {
        "durably.workflow_id": workflow_id,
        "durably.seq": seq,
        "durably.attempt": attempt,
        "durably.step": step,
    }
    with tracer.start_as_current_span(f"step {step}", attributes=attributes) as span:
        yield span


def record_result(span: Any, step: str, result: Any) -> None:
    """Add a model call's model and token counts to its span (GenAI attribute names)."""
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
