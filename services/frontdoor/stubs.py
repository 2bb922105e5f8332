"""The generated protobuf/gRPC modules, generated on first import when missing or stale.

Everything else imports `pb2` and `pb2_grpc` from here, so a fresh clone (or a changed .proto)
works without remembering `make proto`.
"""

from __future__ import annotations

import importlib

from services.frontdoor import codegen

if codegen.is_stale():
    codegen.generate()
    importlib.invalidate_caches()

from services.frontdoor.generated import adaptive_rag_pb2 as pb2  # noqa: E402
from services.frontdoor.generated import adaptive_rag_pb2_grpc as pb2_grpc  # noqa: E402

SERVICE_NAME = pb2.DESCRIPTOR.services_by_name["AdaptiveRag"].full_name
KB_SERVICE_NAME = pb2.DESCRIPTOR.services_by_name["KnowledgeBase"].full_name
# Health service names (grpc.health.v1). Readiness ("" and the two API services) follows the
# dependencies: NOT_SERVING sends calls to another replica. Liveness only says the process and its
# event loop answer: an orchestrator restarts the process when it fails, never for a dependency
# outage (a restart would not bring PostgreSQL back and would drop the calls in flight).
READINESS_SERVICES = ("", SERVICE_NAME, KB_SERVICE_NAME)
LIVENESS_SERVICE = "liveness"
# The trailer naming why a call failed: an `adaptive_rag.contracts.CallError` value, stable like
# the status message that goes with it.
ERROR_CODE_METADATA = "x-error-code"

__all__ = ["ERROR_CODE_METADATA", "KB_SERVICE_NAME", "SERVICE_NAME", "pb2", "pb2_grpc"]
