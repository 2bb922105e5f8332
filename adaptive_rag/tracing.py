"""Spans around the library's own phases, on the OpenTelemetry API only.

The library never configures tracing: the process that runs it (the front door, a worker) installs
an SDK tracer provider and an exporter (`workers.telemetry`), and these spans join whatever trace
is current there (the gRPC call, the Celery task). Without an SDK the API hands out non-recording
spans, so `span` costs a context switch and nothing is kept.

Names: `serving.<stage>` for the front door's stages (`CallProgress.stage`); in a worker's task,
`records.claim`, `resources`, `strategy <name>` for the run and `records.write`; below the run,
`retrieve` / `generate` for each of its phases (`step` counts them, tokens on `generate`).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import inject

_TRACER = trace.get_tracer("adaptive_rag")
# Attribute names of the OpenTelemetry GenAI conventions, so any backend shows token counts.
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
AttributeValue = str | bool | int | float


@contextmanager
def span(name: str, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
         **attributes: AttributeValue | None) -> Iterator[trace.Span]:
    """A child span of the current one for the `with` block; attributes set to None are left out.

    An exception leaving the block is recorded on the span (status ERROR) and raised on.
    Inside a trace that is not sampled (a valid parent that records nothing) no span is made:
    under the parent-based sampler its children would not be recorded either, and making them
    costs the hot path (a front door or worker) more than the work they would time.
    """
    parent = trace.get_current_span()
    if not parent.is_recording() and parent.get_span_context().is_valid:
        yield parent
        return
    with _TRACER.start_as_current_span(name, kind=kind) as current:
        if current.is_recording():
            for key, value in attributes.items():
                if value is not None:
                    current.set_attribute(key, value)
        yield current


def annotate(**attributes: AttributeValue | None) -> None:
    """Set attributes on the current span (nothing without a recording one)."""
    current = trace.get_current_span()
    if current.is_recording():
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(key, value)


def current_trace_id() -> str | None:
    """The current trace's id as 32 hex digits, None outside a trace (or with tracing off)."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def inject_context(carrier: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Write the current trace context (W3C `traceparent`) into `carrier`, e.g. message headers."""
    inject(carrier)
    return carrier


def add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: `trace_id` and `span_id` on every line logged inside a trace, so a
    log line leads to its trace and back."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event
