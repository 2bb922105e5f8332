"""A request body that is not a valid protobuf message gets INVALID_ARGUMENT, for every method.

grpcio deserializes a request before any servicer code runs; when the generated `FromString`
raises, the aio server ends the call with UNKNOWN and "Unexpected <class
'google.protobuf.message.DecodeError'>: ..." (an internal class name, and the wrong code: the
client sent a bad request). `UndecodableRequestGuard` wraps every method handler's deserializer
so a body that does not parse becomes an `Undecodable` marker instead of an exception, and the
wrapped handler answers it with INVALID_ARGUMENT and a stable message (`CallError`
UNDECODABLE_REQUEST, or REQUEST_TOO_LARGE; sizes and the message type go to the log) before the
servicer sees it. Client-streaming methods are guarded per message, for the message that does not parse.

The same guard bounds a method's request size where its fields are bounded (`max_bytes`): an
Answer or Route request larger than the longest valid query could be is rejected the same way,
before it is parsed, while the server's own limit stays high enough for knowledge-base batches.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from adaptive_rag.contracts import CALL_ERROR_MESSAGES, CallError

from services.frontdoor.stubs import ERROR_CODE_METADATA

LOG = structlog.get_logger("frontdoor")


@dataclass(frozen=True)
class Undecodable:
    """Stands for a request message that did not parse, or was larger than its method accepts
    (`limit`); never reaches a servicer."""

    message_type: str
    size: int
    limit: int | None = None


def _message_type(deserializer: Callable[[bytes], Any]) -> str:
    owner = getattr(deserializer, "__self__", None)  # a generated `Message.FromString`
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "request")


def safe_deserializer(deserializer: Callable[[bytes], Any] | None,
                      max_bytes: int | None = None) -> Callable[[bytes], Any] | None:
    """`deserializer` that returns `Undecodable` instead of raising (and, with `max_bytes`, for a
    body larger than that, without parsing it)."""
    if deserializer is None:
        return None
    message_type = _message_type(deserializer)

    def deserialize(raw: bytes) -> Any:
        if max_bytes is not None and len(raw) > max_bytes:
            return Undecodable(message_type, len(raw), max_bytes)
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - DecodeError, or invalid UTF-8 in a string field
            return Undecodable(message_type, len(raw))

    return deserialize


def rejection(request: Undecodable) -> str:
    if request.limit is not None:
        return (f"the request body ({request.size} bytes) is larger than a {request.message_type} "
                f"may be ({request.limit} bytes: the longest query allowed, ARAG_MAX_QUERY_CHARS, "
                "in UTF-8, with its other fields)")
    return (f"the request body ({request.size} bytes) is not a valid {request.message_type} "
            "protobuf message (malformed, or a string field that is not UTF-8)")


async def _reject(context: grpc.aio.ServicerContext, request: Undecodable, method: str) -> None:
    reason = CallError.UNDECODABLE_REQUEST if request.limit is None else CallError.REQUEST_TOO_LARGE
    LOG.warning("rpc", method=method, code=grpc.StatusCode.INVALID_ARGUMENT.name,
                error_code=reason.value, detail=rejection(request))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, CALL_ERROR_MESSAGES[reason],
                        trailing_metadata=((ERROR_CODE_METADATA, reason.value),))


def _checked_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext,
                    method: str) -> AsyncIterator[Any]:
    async def checked() -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                await _reject(context, request, method)
            yield request

    return checked()


def _guard_behavior(behavior: Callable[..., Any], streaming_request: bool, method: str) -> Callable[..., Any]:
    """`behavior` that first rejects an undecodable request (or stream message)."""

    def prepare(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _checked_stream(request, context, method) if streaming_request else request

    if inspect.isasyncgenfunction(behavior):
        async def guarded_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _reject(context, request, method)
            async for response in behavior(prepare(request, context), context):
                yield response

        return guarded_stream

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _reject(context, request, method)
        result = behavior(prepare(request, context), context)
        return await result if inspect.isawaitable(result) else result

    return guarded


def guard_handler(handler: grpc.RpcMethodHandler, method: str,
                  max_bytes: int | None = None) -> grpc.RpcMethodHandler:
    """The same handler with a safe deserializer and a behavior that rejects undecodable input."""
    deserialize = safe_deserializer(handler.request_deserializer, max_bytes)
    serialize = handler.response_serializer
    streaming = handler.request_streaming
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _guard_behavior(handler.unary_unary, streaming, method), deserialize, serialize)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            _guard_behavior(handler.unary_stream, streaming, method), deserialize, serialize)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            _guard_behavior(handler.stream_unary, streaming, method), deserialize, serialize)
    return grpc.stream_stream_rpc_method_handler(
        _guard_behavior(handler.stream_stream, streaming, method), deserialize, serialize)


class UndecodableRequestGuard(grpc.aio.ServerInterceptor):
    """Every method of the server: an undecodable request is INVALID_ARGUMENT, not UNKNOWN.
    The guarded handler of a method is built once and reused (the servicer's handler of a
    method never changes). `max_bytes`: the largest request body per full method name
    (`/package.Service/Method`); methods left out are bounded by the server's limit only."""

    def __init__(self, max_bytes: Mapping[str, int] | None = None) -> None:
        self.max_bytes = dict(max_bytes or {})
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._guarded[method] = (
                handler, guard_handler(handler, method.rsplit("/", 1)[-1], self.max_bytes.get(method)))
        return cached[1]
