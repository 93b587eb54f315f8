"""OpenTelemetry: one span per real step execution; a recovery replays without spans."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import durably
from tests.serverkit import harness


def spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_killed_and_recovered_workflow_emits_one_span_per_step_execution(
    store_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "spans.jsonl"
    flag = tmp_path / "hold"
    flag.write_text("hold")
    client = durably.Client(store_url)
    client.start("srv-crash", "C1", str(flag), workflow_id="otel")
    worker = [sys.executable, "-m", "tests.serverkit.otel_worker", store_url, str(out)]
    with harness.process(worker) as first:
        harness.until(lambda: Path(str(flag) + ".started").exists(), "the charge step to start")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    before = spans(out)
    assert [s["name"] for s in before] == ["step fetch_order"]
    flag.unlink()
    with harness.process(worker):
        harness.until(lambda: client.get_workflow("otel").status == "completed", "the recovery", 60)
        harness.until(lambda: len(spans(out)) > len(before), "the second worker's span")
    after = spans(out)[len(before) :]
    # fetch_order was replayed from the journal: no span; slow_charge ran for real: one.
    assert [s["name"] for s in after] == ["step slow_charge"]
    [charge] = after
    assert (charge["durably.workflow_id"], charge["durably.seq"]) == ("otel", 2)
    assert charge["durably.attempt"] == 1 and charge["pid"] != before[0]["pid"]
    assert before[0]["durably.seq"] == 1 and before[0]["durably.step"] == "fetch_order"


def test_a_model_step_span_carries_the_genai_model_and_token_counts() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durably import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    response = {"model": "gpt-4.1", "usage": {"prompt_tokens": 12, "completion_tokens": 3}}
    with tracer.start_as_current_span("step llm:chat") as span:
        telemetry.record_result(span, "llm:chat", response)
        telemetry.record_result(span, "charge", {"model": "not-a-model-call"})
    [done] = exporter.get_finished_spans()
    assert dict(done.attributes or {}) == {
        "gen_ai.response.model": "gpt-4.1",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
    }
