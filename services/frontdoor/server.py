"""The `AdaptiveRag` gRPC service on `grpc.aio`: the gRPC edge of `adaptive_rag.serving`.

Each method reads its request and metadata, calls the matching `AnswerService` use case and turns
the outcome into a reply, or an exception into a status through the one table below. A failed
call's client gets the status, the stable message of the error's `CallError` (with the request id
when there is one) and its code in the `x-error-code` trailer; the exception's own text (hosts,
paths, class names) goes to the log only. Metrics, logs and the `x-request-id` and `trace-id`
trailers are added here, for every outcome. Every call except
health and reflection is a server span of its trace (OpenTelemetry's aio server interceptor,
continuing a client's `traceparent`); the port is plaintext or TLS / mutual TLS (`start_server`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, health_check, negate, service_prefix

from adaptive_rag.contracts import (
    CALL_ERROR_MESSAGES, SHADOW_QUEUE, TIERS, CallError, ErrorCode, RoutingDecision, Tier,
)
from adaptive_rag.errors import (
    AdaptiveRagError, AnswerFailedError, AnswerTimeoutError, DependencyUnavailableError,
    ClientRequestIdReusedError, InvalidRequestError, KnowledgeBaseBusyError, KnowledgeBaseMissingError,
    OverShareError, PermissionDeniedError, QueueFullError, RequestNotFinishedError, RequestNotFoundError,
    UnauthenticatedError, short_error,
)
from adaptive_rag.knowledge.service import KnowledgeBaseService
from adaptive_rag.routing.hot_swap import ClassifierRouter, FixedRouter
from adaptive_rag.serving import commands
from adaptive_rag.serving.commands import Answered, Routed
from adaptive_rag.serving.context import AdmissionConfig, CallProgress
from adaptive_rag.serving.ports import FairShare, Records, ResultWaiter, TaskQueue
from adaptive_rag.serving.service import AnswerService
from adaptive_rag.ports import LLM
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import strategy_for_tier
from adaptive_rag.tracing import current_trace_id
from adaptive_rag.validation import MAX_CLIENT_REQUEST_ID, MAX_REQUEST_ID

from services.frontdoor.auth import bearer_token
from services.frontdoor.faults import after_record
from services.frontdoor.guards import UndecodableRequestGuard
from services.frontdoor.knowledge import KnowledgeBaseServicer
from services.frontdoor.metrics import FrontDoorMetrics
from services.frontdoor.settings import FrontDoorSettings
from services.frontdoor.stubs import (
    ERROR_CODE_METADATA, KB_SERVICE_NAME, LIVENESS_SERVICE, READINESS_SERVICES, SERVICE_NAME, pb2, pb2_grpc,
)

LOG = structlog.get_logger("frontdoor")
REQUEST_ID_METADATA = "x-request-id"
RETRY_AFTER_METADATA = "retry-after"  # seconds, for a tenant over its share
TRACE_ID_METADATA = "trace-id"  # the call's OpenTelemetry trace (when this process exports traces)
TIER_ENUM = {Tier.A: pb2.TIER_A, Tier.B: pb2.TIER_B, Tier.C: pb2.TIER_C}  # the wire's names

# The one exception -> status table of this boundary (first match wins: subclasses first). What
# the client reads is the exception's `reason` (`CALL_ERROR_MESSAGES`), never its text.
STATUS_FOR_ERROR: tuple[tuple[type[AdaptiveRagError], grpc.StatusCode], ...] = (
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (KnowledgeBaseMissingError, grpc.StatusCode.FAILED_PRECONDITION),
    (KnowledgeBaseBusyError, grpc.StatusCode.ABORTED),
    (DependencyUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AnswerTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (RequestNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ClientRequestIdReusedError, grpc.StatusCode.ALREADY_EXISTS),
    (RequestNotFinishedError, grpc.StatusCode.FAILED_PRECONDITION),
)
# A worker's recorded error code -> the status the client gets.
STATUS_FOR_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.DEPENDENCY_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.TIME_LIMIT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}
# A status message travels in a header (grpc-message): one that repeats a huge input would exceed
# the client's header limit (the client then sees RESOURCE_EXHAUSTED instead of the real status).
# The stable messages are far shorter; `clip` bounds what a log or health line repeats.
MAX_STATUS_MESSAGE_CHARS = 512
# How much of a failed call's exception text its log line keeps.
MAX_LOGGED_DETAIL_CHARS = 2000
# Knowledge-base batches are larger than queries: 32 MB per message, the server's limit. The
# query-carrying methods are bounded far lower by the guard (`request_limits`).
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Bytes per character of UTF-8 at most, and room for field tags and lengths.
_UTF8_MAX = 4
_FRAMING_BYTES = 64


def clip(text: str, limit: int = MAX_STATUS_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters (saying how long it was): no status message ever
    carries an unbounded piece of a request."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters)"
    return text[: limit - len(tail)] + tail


def request_limits(max_query_chars: int) -> dict[str, int]:
    """The largest valid Answer / Route request body, per full method name: the longest query
    allowed in UTF-8 plus a client_request_id and a conversation_id of their longest (anything larger cannot be valid,
    so it is refused before it is parsed)."""
    answer = _UTF8_MAX * (max_query_chars + MAX_CLIENT_REQUEST_ID + MAX_REQUEST_ID) + _FRAMING_BYTES
    route = _UTF8_MAX * max_query_chars + _FRAMING_BYTES
    return {f"/{SERVICE_NAME}/Answer": answer, f"/{SERVICE_NAME}/Route": route}


def server_credentials(settings: FrontDoorSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' PEM files (None: plaintext); with a client CA, a client
    must present a certificate it signed (mutual TLS)."""
    if not settings.tls:
        return None
    assert settings.tls_cert is not None and settings.tls_key is not None
    client_ca = settings.tls_client_ca.read_bytes() if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
        root_certificates=client_ca, require_client_auth=client_ca is not None,
    )


def status_for(exc: Exception) -> tuple[grpc.StatusCode, CallError]:
    """The status a failed call ends with and what its client is told of it (a stable
    `CallError`: the exception's text stays in the log)."""
    if isinstance(exc, AnswerFailedError):
        return STATUS_FOR_CODE.get(exc.code, grpc.StatusCode.INTERNAL), exc.reason
    for error_type, code in STATUS_FOR_ERROR:
        if isinstance(exc, error_type):
            return code, exc.reason
    return grpc.StatusCode.INTERNAL, CallError.INTERNAL


def client_message(reason: CallError, request_id: str | None = None) -> str:
    """The status message of `reason`: its stable text, and the request id when the call has one."""
    message = CALL_ERROR_MESSAGES[reason]
    return f"{message} (request {request_id})" if request_id else message


def query_input(request: Any) -> bytes:
    """The query of an AnswerRequest / RouteRequest as UTF-8 bytes, from whichever of `query`
    (bytes) and `query_text` (string) the client set; neither gives b"" ("query is empty")."""
    if request.WhichOneof("query_input") == "query_text":
        return request.query_text.encode("utf-8")
    return request.query


def optional(request: Any, name: str) -> Any:
    """An optional field's value, None when the client left it unset."""
    return getattr(request, name) if request.HasField(name) else None


def build_reply(answered: Answered) -> pb2.AnswerReply:
    """The AnswerReply of a live or stored answer (one function for both)."""
    decision, result = answered.decision, answered.result
    return pb2.AnswerReply(
        request_id=answered.request_id,
        answer=result.answer or "",
        tier=TIER_ENUM[result.tier],
        strategy=result.strategy or decision.strategy,
        steps=result.steps,
        sources=[pb2.Source(id=s.id, title=s.title, score=s.score) for s in result.sources],
        classifier=_classifier_info(decision),
        timings=pb2.Timings(
            classify_ms=decision.classify_ms, queue_wait_ms=result.timings.queue_wait_ms,
            strategy_ms=result.timings.strategy_ms, total_ms=answered.total_ms,
        ),
        replayed=answered.replayed,
        answerable=result.answerable,
        unanswerable_reason=result.abstain_reason or "",
        conversation_id=answered.conversation_id,
        rewritten_query=answered.rewritten_query,
        rewrite=answered.rewrite,
    )


def build_route_reply(routed: Routed) -> pb2.RouteReply:
    decision = routed.decision
    return pb2.RouteReply(
        decision_id=routed.decision_id, tier=TIER_ENUM[decision.tier], strategy=decision.strategy,
        classifier=_classifier_info(decision), classify_ms=decision.classify_ms,
    )


def _classifier_info(decision: RoutingDecision) -> pb2.ClassifierInfo:
    return pb2.ClassifierInfo(
        probabilities=decision.probabilities or {}, model_name=decision.model_name,
        model_version=decision.model_version or 0, fallback=decision.fallback, reason=decision.reason,
    )


def answer_service(
    library: Settings, settings: FrontDoorSettings, records: Records, queue: TaskQueue,
    waiter: ResultWaiter, router: ClassifierRouter, metrics: FrontDoorMetrics,
    knowledge: KnowledgeBaseService, fair_share: FairShare | None = None,
    sample: Callable[[], float] = random.random,
) -> AnswerService:
    """The use cases wired to this front door's settings and metrics."""
    config = AdmissionConfig(
        max_query_chars=library.max_query_chars, max_queue_depth=settings.max_queue_depth,
        strategy_for=lambda tier: strategy_for_tier(tier, library), shadow_share=settings.shadow_share,
        key_cache_s=settings.key_cache_s, slot_lease_s=settings.tenant_lease_s,
        queued_expiry_s=settings.queued_expiry_s, queue_wait_target_s=settings.queue_wait_target_s,
        unpublished_after_s=settings.unpublished_after_s if settings.relay_every_s else None,
        lost_after_s=settings.lost_after_s if settings.lost_check_every_s else None,
        queue_wait_interval_s=settings.queue_wait_interval_s,
        depth_max_age_s=settings.queue_depth_max_age_s, io_threads=settings.io_threads,
        conversation_turns=settings.conversation_turns,
        conversation_retention_s=settings.conversation_retention_s,
    )
    return AnswerService(
        records, queue, waiter, router, config, has_knowledge_base=knowledge.has_knowledge_base,
        fair_share=fair_share, sample=sample, on_routed=metrics.routed_decision,
        on_rejected=metrics.rejected_query, on_queue_depth=metrics.queue_depth_seen,
        on_expired=metrics.expired_requests, on_republished=metrics.republished_requests,
        on_recorded=after_record(settings), rewriter=follow_up_rewriter(library, settings),
    )


def follow_up_rewriter(library: Settings, settings: FrontDoorSettings) -> LLM | None:
    """The reader that rewrites follow-ups no rule fits (`FrontDoorSettings.rewrite_with`)."""
    if settings.rewrite_with == "rules" or (settings.rewrite_with == "auto" and not library.llm_base_url):
        return None
    from adaptive_rag.llm import build_llm

    return build_llm(library)


class FrontDoor(pb2_grpc.AdaptiveRagServicer):
    """The servicer: every method runs through `run_call` (status mapping, metrics, logs); the
    `KnowledgeBase` servicer (`services.frontdoor.knowledge`) runs its calls through it too."""

    def __init__(self, service: AnswerService, settings: FrontDoorSettings, metrics: FrontDoorMetrics,
                 worker_probe: Callable[[], list[str]] | None = None,
                 llm_probe: Callable[[], str | None] | None = None) -> None:
        """`worker_probe`: the names of the workers that answer a ping now (health checks it;
        None: not checked). `llm_probe`: what keeps the workers' LLM endpoint from answering
        (None: ready; the probe None: not checked)."""
        self.service = service
        self.settings = settings
        self.metrics = metrics
        self.worker_probe = worker_probe
        self.llm_probe = llm_probe
        self.workers_seen: list[str] = []  # the last ping's answers (health cycle)
        self._missing_queues: list[str] = []

    async def run_call(
        self, method: str, context: grpc.aio.ServicerContext,
        body: Callable[[CallProgress], Awaitable[Any]],
    ) -> Any:
        started = time.perf_counter()
        progress = CallProgress()
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(method=method)
        code, detail, reply = grpc.StatusCode.OK, "", None
        reason: CallError | None = None
        retry_after: float | None = None
        try:
            reply = await body(progress)
        except asyncio.CancelledError:
            code, detail = grpc.StatusCode.CANCELLED, "client went away"
            raise
        except grpc.aio.AbortError:  # the request guard rejected a message of a client stream
            code, detail = grpc.StatusCode.INVALID_ARGUMENT, "undecodable request message"
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a precise status
            code, reason = status_for(exc)
            detail = short_error(exc, MAX_LOGGED_DETAIL_CHARS, with_type=True)
            if isinstance(exc, OverShareError):
                retry_after = exc.retry_after_s
            elif code is grpc.StatusCode.UNAVAILABLE:
                retry_after = self.settings.unavailable_retry_s
            if reason is CallError.INTERNAL:
                LOG.exception("rpc_failed")
        finally:
            elapsed = time.perf_counter() - started
            tier = progress.tier.value if progress.tier else "none"
            self.metrics.observe(method, tier, code.name, elapsed)
            self.metrics.observe_stages(method, progress.stages)
            log = LOG.info if code is grpc.StatusCode.OK else LOG.warning
            log("rpc", code=code.name, tier=tier, ms=round(1000 * elapsed, 2),
                stages_ms={k: round(v, 2) for k, v in progress.stages.items()},
                **({"error_code": reason.value} if reason else {}),
                **({"detail": detail} if detail else {}))
        trailing: tuple[tuple[str, str], ...] = (
            ((REQUEST_ID_METADATA, progress.request_id),) if progress.request_id else ()
        )
        if reason is not None:
            trailing += ((ERROR_CODE_METADATA, reason.value),)
        trace_id = current_trace_id()
        if trace_id:
            trailing += ((TRACE_ID_METADATA, trace_id),)
        if retry_after is not None:
            trailing += ((RETRY_AFTER_METADATA, f"{retry_after:.3f}"),)
        if code is grpc.StatusCode.OK:
            if trailing:
                context.set_trailing_metadata(trailing)
            return reply
        assert reason is not None  # a call that failed in its body (cancelled and aborted ones re-raised)
        await context.abort(code, client_message(reason, progress.request_id), trailing_metadata=trailing)

    def _deadline(self, context: grpc.aio.ServicerContext) -> float:
        """Monotonic time by which Answer must reply, leaving the margin before the client's."""
        remaining = context.time_remaining()
        if remaining is None:
            return time.monotonic() + self.settings.default_wait_s
        return time.monotonic() + max(0.0, remaining - self.settings.deadline_margin_s)

    async def Answer(self, request, context):  # noqa: N802 - gRPC method name
        async def body(progress: CallProgress) -> pb2.AnswerReply:
            answered = await self.service.answer(commands.Answer(
                api_key=bearer_token(context.invocation_metadata()), raw_query=query_input(request),
                client_request_id=optional(request, "client_request_id"),
                deadline=self._deadline(context),
                conversation_id=optional(request, "conversation_id"),
            ), progress)
            with progress.stage("reply"):
                return build_reply(answered)

        return await self.run_call("Answer", context, body)

    async def GetResult(self, request, context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.AnswerReply:
            answered = await self.service.get_result(commands.GetResult(
                api_key=bearer_token(context.invocation_metadata()), request_id=request.request_id,
            ), progress)
            return build_reply(answered)

        return await self.run_call("GetResult", context, body)

    async def SubmitFeedback(self, request, context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.FeedbackReply:
            feedback_id = await self.service.submit_feedback(commands.SubmitFeedback(
                api_key=bearer_token(context.invocation_metadata()), request_id=request.request_id,
                rating=request.rating, correct_answer=optional(request, "correct_answer"),
                comment=optional(request, "comment"),
            ), progress)
            return pb2.FeedbackReply(feedback_id=feedback_id)

        return await self.run_call("SubmitFeedback", context, body)

    async def Route(self, request, context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.RouteReply:
            routed = await self.service.route(commands.Route(
                api_key=bearer_token(context.invocation_metadata()), raw_query=query_input(request),
            ), progress)
            return build_route_reply(routed)

        return await self.run_call("Route", context, body)

    def queues(self) -> list[str]:
        """The queues this front door sends to: each tier's (one shared queue in the comparison
        setup) and the shadow queue."""
        return sorted({self.service.queue.queue_name(tier) for tier in TIERS} | {SHADOW_QUEUE})

    async def watch_health(self, health_servicer: health.aio.HealthServicer, interval_s: float = 5.0) -> None:
        """Readiness says NOT_SERVING while the records database or the task queue is away, no
        worker answers a ping, or the LLM endpoint the workers call is not ready (a load balancer
        then sends calls to another replica), SERVING again when all answer. Liveness (`LIVENESS_SERVICE`) is left SERVING: see `stubs`."""
        serving = True
        while True:
            problems = await self.service.dependency_problems()
            if not problems:
                problems = await self.worker_problems()
            if not problems and self.llm_probe is not None:
                problem = await asyncio.to_thread(self.llm_probe)
                problems = [problem] if problem else []
            if serving != (not problems):
                serving = not problems
                status = (health_pb2.HealthCheckResponse.SERVING if serving
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
                for name in READINESS_SERVICES:
                    await health_servicer.set(name, status)
                (LOG.info if serving else LOG.warning)("health", serving=serving, problems=problems)
            await asyncio.sleep(interval_s)

    async def worker_problems(self) -> list[str]:
        """Empty when at least one worker answers a ping (or workers are not checked). A tier
        queue without a worker is logged (its queries wait) but does not stop the others."""
        if self.worker_probe is None:
            return []
        try:
            alive = await asyncio.to_thread(self.worker_probe)
        except Exception as exc:  # noqa: BLE001 - any failure means no worker is known to run
            self.workers_seen = []
            return [f"workers: {clip(str(exc), 200)}"]
        self.workers_seen = alive
        served = {name.split("@", 1)[0] for name in alive}
        queues = self.queues()
        for queue in queues:
            self.metrics.workers_alive.labels(queue).set(
                sum(1 for name in alive if name.split("@", 1)[0] == queue))
        missing = [queue for queue in queues if queue not in served and queue != SHADOW_QUEUE]
        if missing != self._missing_queues:
            self._missing_queues = missing
            (LOG.warning if missing else LOG.info)("workers", missing_queues=missing, alive=alive)
        if not alive:
            return [f"workers: none answered a ping within {self.settings.worker_ping_timeout_s:.1f} s"]
        return []

    async def watch_queues(self, interval_s: float = 5.0) -> None:
        """Keep the queue-depth gauge current for every queue, not only the ones queried."""
        queues = self.queues()
        while True:
            await self.service.queue_depths(queues)
            await asyncio.sleep(interval_s)

    async def every(self, interval_s: float, work: Callable[[], Awaitable[object]], name: str) -> None:
        """Run an upkeep pass now and then every `interval_s`: the expiry sweep
        (`AnswerService.expire_stale`; on PostgreSQL one replica sweeps at a time), the relay of
        unpublished tasks (`AnswerService.relay_unpublished`; replicas take disjoint rows), the
        republish of messages the broker lost (`AnswerService.republish_lost`), the
        revocation watch (`AnswerService.drop_revoked_keys`). A failed pass (the records or the
        broker away) is tried again on the next cycle."""
        while True:
            try:
                await work()
            except Exception as exc:  # noqa: BLE001 - keep going once the dependency is back
                LOG.warning(f"{name}_failed", error=clip(f"{type(exc).__name__}: {exc}", 200))
            await asyncio.sleep(interval_s)


@dataclass
class RunningServer:
    """A started front door: the grpc.aio server, its bound port and the servicer."""

    server: grpc.aio.Server
    port: int
    servicer: FrontDoor
    health: health.aio.HealthServicer
    tasks: list[asyncio.Task]
    router: ClassifierRouter | FixedRouter
    waiter: Any

    async def stop(self, grace: float | None = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        for task in self.tasks:
            task.cancel()
        await self.server.stop(grace)
        await self.waiter.close()
        self.router.close()
        self.servicer.service.close()


async def start_server(
    library: Settings, settings: FrontDoorSettings, records: Records, queue: TaskQueue, waiter: Any,
    router: ClassifierRouter | FixedRouter, knowledge: KnowledgeBaseService, metrics: FrontDoorMetrics | None = None,
    listen: str | None = None, poll_models: bool = True, queue_watch_s: float | None = 5.0,
    health_watch_s: float | None = 5.0,
    sample: Callable[[], float] = random.random, fair_share: FairShare | None = None,
    worker_probe: Callable[[], list[str]] | None = None,
    llm_probe: Callable[[], str | None] | None = None,
) -> RunningServer:
    """Build, bind and start the server (health, and reflection unless switched off); `listen`
    may end in :0. TLS when the settings name a certificate and key (`server_credentials`).

    `waiter` is started here, on the server's event loop (the Redis waiter binds to it).
    `worker_probe`: what health asks whether any worker runs (None: not asked); `llm_probe`:
    whether the workers' LLM endpoint is ready (None: not asked).
    """
    metrics = metrics or FrontDoorMetrics()
    await waiter.start()
    service = answer_service(library, settings, records, queue, waiter, router, metrics, knowledge,
                             fair_share, sample)
    servicer = FrontDoor(service, settings, metrics, worker_probe, llm_probe)
    server = grpc.aio.server(
        interceptors=[
            # outermost: a span per call (health checks and reflection left out)
            aio_server_interceptor(filter_=negate(any_of(health_check(), service_prefix("grpc.reflection")))),
            UndecodableRequestGuard(request_limits(library.max_query_chars)),
        ],
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
    )
    pb2_grpc.add_AdaptiveRagServicer_to_server(servicer, server)
    pb2_grpc.add_KnowledgeBaseServicer_to_server(KnowledgeBaseServicer(servicer, knowledge), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if settings.grpc_reflection:
        reflection.enable_server_reflection(
            (SERVICE_NAME, KB_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
    credentials = server_credentials(settings)
    address = listen or settings.grpc_listen
    port = (server.add_secure_port(address, credentials) if credentials is not None
            else server.add_insecure_port(address))
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen or settings.grpc_listen}")
    await server.start()
    for name in (*READINESS_SERVICES, LIVENESS_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    tasks = []
    if poll_models:
        tasks.append(asyncio.create_task(router.poll_forever(), name="model-poll"))
    if queue_watch_s:
        tasks.append(asyncio.create_task(servicer.watch_queues(queue_watch_s), name="queue-watch"))
    if settings.relay_every_s:  # its first pass at start-up: what a dead front door left
        tasks.append(asyncio.create_task(servicer.every(
            settings.relay_every_s, service.relay_unpublished, "relay"), name="relay"))
    if settings.lost_check_every_s:
        tasks.append(asyncio.create_task(servicer.every(
            settings.lost_check_every_s, service.republish_lost, "lost_check"), name="lost-check"))
    if settings.key_revocation_s and settings.key_cache_s:  # nothing cached: nothing to forget
        tasks.append(asyncio.create_task(servicer.every(
            settings.key_revocation_s, service.drop_revoked_keys, "key_revocation"), name="key-revocation"))
    if settings.expiry_sweep_s:
        tasks.append(asyncio.create_task(servicer.every(
            settings.expiry_sweep_s, service.expire_stale, "expiry_sweep"), name="expiry-sweep"))
    if health_watch_s:
        tasks.append(asyncio.create_task(servicer.watch_health(health_servicer, health_watch_s),
                                         name="health-watch"))
    LOG.info("listening", port=port, model_version=router.version, tls=settings.tls,
             mutual_tls=settings.tls_client_ca is not None, reflection=settings.grpc_reflection)
    return RunningServer(server, port, servicer, health_servicer, tasks, router, waiter)
