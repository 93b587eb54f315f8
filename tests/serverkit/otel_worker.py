"""A ``durably worker`` process whose finished spans are appended to a file as they end.

``python -m tests.serverkit.otel_worker DATABASE_URL SPANS_FILE``: runs the
workflows of tests.serverkit.flows. A span is written (and fsynced) when it
ends, so a process killed with SIGKILL leaves exactly the spans it finished.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for span in spans:
                record = {
                    "name": span.name,
                    "pid": os.getpid(),
                    "span_id": span.context.span_id if span.context else None,
                    "parent_id": span.parent.span_id if span.parent else None,
                    **dict(span.attributes or {}),
                }
                f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return SpanExportResult.SUCCESS


def main(url: str, path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)
    from durably import cli

    cli.main(
        ["--database", url, "worker", "tests.serverkit.flows", "--poll", "0.1", "--lease", "1"]
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
