"""Structured JSON logs (structlog), configured once per process by its entry point (the front
door's main, the Celery worker's start): one JSON object per line on stderr. The request id and
tenant are bound per call through context variables, so every line of one request carries them."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from adaptive_rag.tracing import add_trace_ids


def configure_logging(level: str = "INFO", stream: TextIO | None = None, stdlib: bool = True) -> None:
    """JSON lines with timestamp, level, event and the bound context (request_id, tenant), plus
    `trace_id`/`span_id` inside a trace (OpenTelemetry, when the process exports traces).

    `stdlib=False` leaves the standard `logging` setup alone (a Celery worker keeps its own
    format for its own lines; only the project's structlog events become JSON).
    """
    stream = stream or sys.stderr
    if stdlib:
        logging.basicConfig(format="%(message)s", stream=stream, level=level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )

