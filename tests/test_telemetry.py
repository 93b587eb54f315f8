"""OpenTelemetry: spans for workflow segments, steps, model calls and waits, never for replay.

The in-process tests set the SDK's tracer provider once for the test process
and read an in-memory exporter; the kill-and-recover test runs real worker
processes whose spans are written to a file as they end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durably
from durably import agents, telemetry
from durably.testing.models import FakeModelServer, text
from tests import children
from tests.serverkit import harness
from tests.test_wake_claim import HELD, held_and_parked, parked, twice


class _Exporter(InMemorySpanExporter):
    """Keeps spans only while a test of this module asks (the provider outlives the test)."""

    active = False

    def export(self, spans: Any) -> SpanExportResult:
        return super().export(spans) if self.active else SpanExportResult.SUCCESS


_EXPORTER = _Exporter()
_LOG = logging.getLogger("tests.telemetry")


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter of the process's tracer provider (set once), emptied."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _EXPORTER.active = True
    try:
        yield _EXPORTER
    finally:
        _EXPORTER.active = False
        _EXPORTER.clear()


def _named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@durably.step
async def note(text: str) -> str:
    _LOG.info("note %s", text)
    return text


@durably.workflow(name="otel-parks")
async def parks_flow() -> Any:
    a = await note("a")
    got = await durably.wait_for_signal("go")
    await durably.sleep(0.01)  # shorter than the hold: waited in memory
    b = await note("b")
    return [a, got, b]


async def _until_status(engine: durably.Engine, wid: str, status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (await engine.get_workflow(wid)).status != status:
        assert asyncio.get_running_loop().time() < deadline, f"{wid} never became {status}"
        await asyncio.sleep(0.02)


async def test_a_parked_and_resumed_workflow_has_one_span_per_segment_step_and_wait(
    store_url: str, exported: InMemorySpanExporter
) -> None:
    async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.05) as engine:
        handle = await engine.start(parks_flow, workflow_id="p")
        await _until_status(engine, "p", "waiting")
        # the row says waiting once the park committed; the segment's span ends when the
        # run's task has unwound after it: wait for the span itself
        deadline = asyncio.get_running_loop().time() + 10
        while not _named(exported.get_finished_spans(), "workflow "):
            assert asyncio.get_running_loop().time() < deadline, "the parked segment never ended"
            await asyncio.sleep(0.01)
        parked = exported.get_finished_spans()
        await engine.send_signal("p", "go", 7)
        assert await handle.result(timeout=20) == ["a", 7, "b"]
        await _until_status(engine, "p", "completed")
    spans = exported.get_finished_spans()
    # before the signal: one segment that parked, its step; the wait has not ended
    [first] = _named(parked, "workflow ")
    assert _attrs(first)["durably.outcome"] == "parked"
    assert _attrs(first)["durably.replayed_entries"] == 0
    assert [s.name for s in _named(parked, "step ")] == ["step note"]
    assert _named(parked, "wait ") == [] and _named(parked, "sleep") == []
    # in all: two segments; each step ran once (replayed "a" has no second span)
    segments = _named(spans, "workflow ")
    assert [_attrs(s)["durably.outcome"] for s in segments] == ["parked", "finished"]
    second = segments[1]
    assert _attrs(second)["durably.replayed_entries"] == 2  # note("a") and the open wait
    steps = _named(spans, "step ")
    assert [(_attrs(s)["durably.seq"], _attrs(s)["durably.attempt"]) for s in steps] == [
        (1, 1),
        (4, 1),
    ]
    # one span per wait, from when it began (in the first segment) to its end
    [wait] = _named(spans, "wait signal go")
    assert _attrs(wait) == {
        "durably.workflow_id": "p",
        "durably.seq": 2,
        "durably.wait": "signal",
        "durably.wait.key": "go",
        "durably.wait.outcome": "completed",
    }
    assert wait.start_time is not None and first.start_time is not None
    assert first.start_time <= wait.start_time <= (first.end_time or 0)
    [sleep] = _named(spans, "sleep")
    assert (_attrs(sleep)["durably.seq"], _attrs(sleep)["durably.wait.outcome"]) == (3, "elapsed")
    # steps and waits are children of the segment that ran them
    assert steps[0].parent is not None and steps[0].parent.span_id == first.context.span_id
    for child in (steps[1], wait, sleep):
        assert child.parent is not None and child.parent.span_id == second.context.span_id
    assert {_attrs(s)["durably.workflow_id"] for s in spans} == {"p"}


LLM: list[agents.DurableLLM] = []


@durably.workflow(name="otel-model")
async def model_flow() -> Any:
    create = LLM[0].chat.completions.create
    first = await create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "hi"}])
    await durably.wait_for_signal("go")  # parks: the resumed run replays the model call
    return first.choices[0].message.content


async def test_a_model_call_has_one_genai_span_and_none_when_replayed(
    sqlite_url: str, exported: InMemorySpanExporter
) -> None:
    reply = text("hello", usage={"prompt_tokens": 12, "completion_tokens": 3})
    with FakeModelServer(lambda body: reply) as server:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="t", max_retries=0) as client:
            LLM[:] = [agents.llm(client)]
            async with durably.Engine(sqlite_url, hold_seconds=0.05, poll_interval=0.05) as engine:
                handle = await engine.start(model_flow, workflow_id="m")
                await _until_status(engine, "m", "waiting")
                await engine.send_signal("m", "go")
                assert await handle.result(timeout=20) == "hello"
        assert len(server.requests) == 1
    spans = exported.get_finished_spans()
    assert len(_named(spans, "workflow ")) == 2  # parked, then resumed and finished
    [chat] = _named(spans, "chat ")
    assert chat.name == "chat gpt-4.1-mini" and chat.kind == trace.SpanKind.CLIENT
    attrs = _attrs(chat)
    assert attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "gpt-4.1-mini"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (12, 3)
    assert (attrs["durably.workflow_id"], attrs["durably.seq"], attrs["durably.attempt"]) == (
        "m",
        1,
        1,
    )
    [step] = _named(spans, "step llm:")
    assert chat.parent is not None and chat.parent.span_id == step.context.span_id
    # token counts sit on the model span only: summing them over spans counts each once
    assert not any(k.startswith("gen_ai.") for k in _attrs(step))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_log_records_inside_a_run_carry_its_workflow_id_and_seq(store_url: str) -> None:
    handler = _Records()
    handler.addFilter(telemetry.LogContextFilter())
    _LOG.addHandler(handler)
    _LOG.setLevel(logging.INFO)
    try:
        async with durably.Engine(store_url, hold_seconds=0.05, poll_interval=0.05) as engine:
            handle = await engine.start(parks_flow, workflow_id="logs")
            await _until_status(engine, "logs", "waiting")
            await engine.send_signal("logs", "go", 1)
            await handle.result(timeout=20)
        _LOG.info("outside")
    finally:
        _LOG.removeHandler(handler)
    seen = [(r.getMessage(), r.workflow_id, r.seq) for r in handler.records]  # type: ignore[attr-defined]
    # "note a" once: the resumed run replayed it without running the step
    assert seen == [("note a", "logs", 1), ("note b", "logs", 4), ("outside", None, None)]


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
    # the killed worker's segment never ended: its span is lost with it
    assert [s["name"] for s in before] == ["step fetch_order"]
    flag.unlink()
    with harness.process(worker):
        harness.until(lambda: client.get_workflow("otel").status == "completed", "the recovery", 60)
        harness.until(lambda: len(spans(out)) >= len(before) + 2, "the second worker's spans")
    after = spans(out)[len(before) :]
    # fetch_order was replayed from the journal: no span; slow_charge ran for real: one.
    assert [s["name"] for s in after] == ["step slow_charge", "workflow srv-crash"]
    charge, segment = after
    assert (charge["durably.workflow_id"], charge["durably.seq"]) == ("otel", 2)
    assert charge["durably.attempt"] == 1 and charge["pid"] != before[0]["pid"]
    assert before[0]["durably.seq"] == 1 and before[0]["durably.step"] == "fetch_order"
    assert charge["parent_id"] == segment["span_id"]
    assert segment["durably.workflow_id"] == "otel" and segment["durably.outcome"] == "finished"
    assert segment["durably.replayed_entries"] == 1  # fetch_order's receipt
    assert segment["durably.crash_count"] >= 1


def test_record_result_sets_the_genai_model_and_token_counts_of_a_model_call() -> None:
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


@durably.workflow(name="telemetry.held-wait")
async def held_wait() -> Any:
    await HELD[0].wait()  # a re-run is held here, before its wait
    return await durably.wait_for_signal("go")


async def test_a_wait_received_with_the_claim_ends_when_the_journal_says(
    store_url: str, exported: InMemorySpanExporter
) -> None:
    """The claim that took the workflow received the signal: the wait's span ends at the
    entry's finished_at, not when the re-run reaches the wait."""
    async with durably.Engine(store_url, hold_seconds=0.0) as engine:
        handle = await held_and_parked(engine, held_wait, "telemetry-held")
        assert await engine.send_signal("telemetry-held", "go", "x")
        await asyncio.sleep(0.5)
        HELD[0].set()
        assert await handle.result(timeout=15) == "x"
        [entry] = [e for e in await engine.history("telemetry-held") if e.kind == "signal"]
    [span] = _named(exported.get_finished_spans(), "wait signal")
    assert span.end_time is not None and entry.finished_at is not None
    assert abs(span.end_time / 1e9 - entry.finished_at) < 0.1
    assert _attrs(span)["durably.wait.outcome"] == "completed"


async def test_a_wait_received_by_a_claim_that_runs_nothing_still_has_its_span(
    store_url: str, exported: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim received the signal, then let the workflow go (its code unregistered
    meanwhile): the next run replays the wait as final, so the span is emitted at the
    let-go, and each wait has one."""
    from durably import engine_recovery

    async with durably.Engine(store_url, hold_seconds=0.0, poll_interval=0.05) as engine:
        handle = await engine.start(twice, workflow_id="telemetry-let-go")
        await parked(engine, handle)
        real = durably.workflows.registered
        answers = iter([None])
        monkeypatch.setattr(
            engine_recovery.workflows, "registered", lambda name: next(answers, real(name))
        )
        assert await engine.send_signal("telemetry-let-go", "go", 1)
        await parked(engine, handle)  # let go, then claimed by a pass and parked again
        assert await engine.send_signal("telemetry-let-go", "go", 2)
        assert await handle.result(timeout=15) == [1, 2]
    waits = _named(exported.get_finished_spans(), "wait signal")
    assert sorted(_attrs(s)["durably.seq"] for s in waits) == [1, 2]


_SPAN_CHILD = """
import asyncio, sys, tempfile
import durably

@durably.step
async def look() -> list[bool]:
    trace = sys.modules.get("opentelemetry.trace")
    return [trace is not None, trace is not None and trace.get_current_span().is_recording()]

@durably.workflow
async def flow() -> list[bool]:
    return await look()

async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with durably.Engine(f"sqlite:///{tmp}/t.db") as engine:
            print(await (await engine.start(flow)).result(timeout=30))

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "[False, False]"),
        ({"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}, "[True, True]"),
    ],
    ids=["nothing-loads-it", "a-provider-named-in-the-environment"],
)
def test_opentelemetry_loads_only_for_a_provider_named_in_the_environment(
    environ: dict[str, str], expected: str
) -> None:
    """``import durably`` does not load OpenTelemetry; a tracer provider named in the
    environment (which no application code imports) still gets durably's step spans."""
    proc = subprocess.run(
        children.python("-c", _SPAN_CHILD),
        env=children.child_env(environ, drop=("DURABLY_", "OTEL_")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
