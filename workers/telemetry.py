"""Trace export for the processes that run the library: the front door and the worker pools.

`configure_tracing(service)` installs the OpenTelemetry SDK once per process with the exporter that
`ARAG_TRACES` names:

- `otlp`: OTLP over HTTP/protobuf to `OTEL_EXPORTER_OTLP_ENDPOINT` (a collector, Tempo, Jaeger);
  the default whenever that variable is set;
- `file`: one JSON object per span, appended to `ARAG_TRACES_DIR/<service>.jsonl` (default
  `var/traces`; `python -m infra.local.trace_tree` prints one trace of them as a tree); what the
  demo and the local stack use;
- `console`: the same JSON lines on stderr;
- `off` (default without an OTLP endpoint): no SDK. The library's spans are then non-recording,
  and nothing is exported.

Spans are batched and written by a background thread (a few microseconds per span on the calling
thread). Lives in `workers` because the front door imports from here too, never the reverse.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from adaptive_rag.settings import env_name

TracesMode = Literal["off", "file", "console", "otlp"]
# How long finished spans wait before the background thread writes them (a trace file is
# readable about this long after the request).
FILE_FLUSH_MS = 500
_lock = threading.Lock()
_provider: TracerProvider | None = None


class TracingSettings(BaseSettings):
    """Where this process's spans go."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", populate_by_name=True)

    traces: TracesMode | None = Field(None, validation_alias=env_name("ARAG_TRACES", "traces"))
    traces_dir: Path = Field(Path("var/traces"), validation_alias=env_name("ARAG_TRACES_DIR", "traces_dir"))
    otlp_endpoint: str | None = Field(
        None, validation_alias=env_name("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"))

    @property
    def mode(self) -> TracesMode:
        """`ARAG_TRACES`, else `otlp` with an OTLP endpoint configured, else `off`."""
        if self.traces is not None:
            return self.traces
        return "otlp" if self.otlp_endpoint else "off"


def span_record(span: ReadableSpan) -> dict:
    """One finished span as the flat JSON object of a trace file (ids in hex, times in ns)."""
    context = span.get_span_context()
    parent = span.parent
    resource = span.resource.attributes if span.resource else {}
    return {
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "service": resource.get("service.name", ""),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
    }


class JsonLinesExporter(SpanExporter):
    """Appends each batch of spans as JSON lines to a file (or a stream): one `write` per batch,
    in append mode, so several processes of one pool can share a file."""

    def __init__(self, path: Path | None = None, stream=None) -> None:
        self.path = path
        self.stream = stream
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        try:
            if self.path is not None:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)
            else:
                (self.stream or sys.stderr).write(text)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def build_exporter(mode: TracesMode, service: str, settings: TracingSettings) -> SpanExporter | None:
    if mode == "off":
        return None
    if mode == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout)
    if mode == "console":
        return JsonLinesExporter(stream=sys.stderr)
    return JsonLinesExporter(settings.traces_dir.resolve() / f"{service}.jsonl")


def configure_tracing(service: str, settings: TracingSettings | None = None,
                      **resource: str) -> TracerProvider | None:
    """Install the SDK for this process (once; later calls return the first provider) with the
    exporter of `ARAG_TRACES`; None when tracing is off. `resource`: extra resource attributes
    (e.g. the worker's queue)."""
    global _provider
    settings = settings or TracingSettings()
    mode = settings.mode
    with _lock:
        if _provider is not None:
            return _provider
        exporter = build_exporter(mode, service, settings)
        if exporter is None:
            return None
        provider = TracerProvider(resource=Resource.create({"service.name": service, **resource}))
        delay = FILE_FLUSH_MS if mode in ("file", "console") else 5000
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay))
        trace.set_tracer_provider(provider)
        _provider = provider
        return provider


def flush_tracing(timeout_ms: int = 5000) -> None:
    """Write the spans still buffered (before a process exits without running atexit hooks, as
    a prefork child does)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)
