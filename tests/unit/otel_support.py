"""One in-memory span exporter for the whole test process (`from otel_support import spans`).

OpenTelemetry's global tracer provider can be set once per process, so the first test that needs
spans installs an SDK provider with a synchronous in-memory exporter and every later one reuses
it; `recorded()` clears it at the start of a test and yields a view of the spans finished since
(readable after the block too, until the next `recorded()`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def exporter() -> InMemorySpanExporter:
    global _exporter
    if _exporter is None:
        provider = TracerProvider(resource=Resource.create({"service.name": "tests"}))
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    return _exporter


class Spans:
    """The spans finished since `recorded()` began (read them after the work is done)."""

    def __init__(self, memory: InMemorySpanExporter) -> None:
        self._memory = memory

    @property
    def all(self) -> list[ReadableSpan]:
        return list(self._memory.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all if s.name == name]

    def one(self, name: str, timeout_s: float = 5.0) -> ReadableSpan:
        """The one span called `name`, waiting for it: a server span ends just after the client
        has its status (an aborted call's status goes out before the handler unwinds)."""
        deadline = time.monotonic() + timeout_s
        while not (found := self.named(name)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(found) == 1, (name, [s.name for s in self.all])
        return found[0]

    def in_trace(self, trace_id: int) -> list[ReadableSpan]:
        return [s for s in self.all if s.context.trace_id == trace_id]


@contextmanager
def recorded() -> Iterator[Spans]:
    memory = exporter()
    memory.clear()
    yield Spans(memory)


def hex_id(trace_id: int) -> str:
    return format(trace_id, "032x")
