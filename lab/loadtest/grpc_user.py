"""A locust User over gRPC, the way locust documents it: a sync stub on `grpc.insecure_channel`
with a client interceptor that fires locust's `request` event for every call.

`grpc.experimental.gevent.init_gevent()` must run before any channel exists (the locustfile does
it right after importing locust, which monkey-patches the standard library); `grpc.aio` is never
used inside locust (its asyncio loop would block the gevent hub).

Names: a successful `Answer` is recorded as `Answer tier=<tier of the reply>`, so locust's stats
table and CSV have a row per tier; a failed one as `Answer` with the exception `CODE: details`
(request ids and numbers masked), so the failures table groups by gRPC status code. What a call's
event carries of its reply or its status (tier, timings, request id, retry-after) is what the lab's
load client records of a call (`lab.harness.load_client.reply_fields` / `error_fields`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import grpc
from locust import User
from locust.exception import LocustError

from lab.harness.load_client import error_fields, reply_fields, tier_name

_MASKS = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (re.compile(r"\b[0-9a-f]{16,}\b", re.I), "<id>"),
    (re.compile(r"\b\d+(\.\d+)*\b"), "#"),
)


class GrpcStatusError(Exception):
    """A failed RPC as locust records it: `CODE: details`, with ids and numbers masked."""

    def __init__(self, code: str, details: str = "") -> None:
        self.code = code
        self.details = details
        masked = details or ""
        for pattern, replacement in _MASKS:
            masked = pattern.sub(replacement, masked)
        masked = masked if len(masked) <= 160 else masked[:157] + "..."
        super().__init__(f"{code}: {masked}" if masked else code)

    def __repr__(self) -> str:  # locust's failures table shows repr(exception)
        return str(self)


def status_error(exc: grpc.RpcError) -> GrpcStatusError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return GrpcStatusError(code.name if code is not None else "UNKNOWN", details or "")


def request_name(method: str, reply: Any) -> str:
    """`Answer tier=A` for a reply that carries a tier, the bare method name otherwise."""
    tier = getattr(reply, "tier", None)
    if reply is not None and tier:
        return f"{method} tier={tier_name(tier)}"
    return method


class LocustInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Fires locust's `request` event (request_type "grpc") after every unary call."""

    def __init__(self, environment: Any, context: Callable[[], dict[str, Any]] | None = None) -> None:
        self.environment = environment
        self.context = context or dict

    def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        short = method.rsplit("/", 1)[-1]
        context = dict(self.context())
        started = time.perf_counter()
        call = continuation(client_call_details, request)  # sync channel: returns when done
        response, exception, length = None, None, 0
        try:
            response = call.result()
            length = response.ByteSize()
        except grpc.RpcError as exc:
            exception = status_error(exc)
            context.update(error_fields(exc))
        response_time = (time.perf_counter() - started) * 1000.0
        if response is not None:
            context["code"] = "OK"
            if hasattr(response, "timings"):
                context.update(reply_fields(response), steps=response.steps)
        self.environment.events.request.fire(
            request_type="grpc", name=request_name(short, response), response_time=response_time,
            response_length=length, response=response, exception=exception, context=context,
            start_time=time.time() - response_time / 1000.0, url=None,
        )
        return call


def channel_target(host: str | None) -> str:
    """`--host` as a gRPC target: `127.0.0.1:50051` (a `grpc://` or `http://` prefix is dropped)."""
    if not host:
        raise LocustError("no front door address: pass --host HOST:PORT (e.g. --host 127.0.0.1:50051)")
    return re.sub(r"^(grpc|http)s?://", "", host.strip()).rstrip("/")


class GrpcUser(User):
    """Base class: `stub_class` over an intercepted insecure channel to `--host`; set
    `self.call_context` before a call to attach facts to its request event."""

    abstract = True
    stub_class: type | None = None

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.call_context: dict[str, Any] = {}
        channel = grpc.insecure_channel(channel_target(self.host))
        self._channel = channel
        intercepted = grpc.intercept_channel(channel, LocustInterceptor(environment, lambda: self.call_context))
        self.stub = self.stub_class(intercepted)

    def on_stop(self) -> None:
        self._channel.close()
