"""The `AdaptiveRag` gRPC service on `grpc.aio`.

One Answer: authenticate (API key -> tenant) -> validate -> idempotency check (tenant,
client_request_id) -> record the request -> classify (Triton + policy, rules fallback) -> record
the decision -> check the tier queue's depth (RESOURCE_EXHAUSTED when full) -> enqueue on the
tier's Celery queue (and, for a sampled share, a shadow run on the neighbouring tier) -> wait for
the result within the client's deadline (DEADLINE_EXCEEDED while the work continues; GetResult
returns it later).

Blocking calls run off the event loop on two thread pools: result waits on one sized for the
Answers allowed to wait at once (`frontdoor_wait_threads`), short calls (SQL, enqueue, queue
depth) on another, so a crowd of waiting Answers never delays authentication or GetResult.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from adaptive_rag.classifier.relabel import neighbour_tier
from adaptive_rag.domain import Tier
from adaptive_rag.errors import DuplicateRequestError, RequestNotFoundError
from adaptive_rag.settings import Settings
from adaptive_rag.storage.records import NEVER_RAN
from adaptive_rag.strategies import strategy_for_tier

from services.frontdoor.auth import Unauthenticated, bearer_token
from services.frontdoor.logs import get_logger
from services.frontdoor.metrics import FrontDoorMetrics
from services.frontdoor.ports import Dispatcher, Store, as_mapping
from services.frontdoor.routing import ClassifierRouter, Routed
from services.frontdoor.stubs import SERVICE_NAME, pb2, pb2_grpc
from services.frontdoor.validation import (
    InvalidArgument, check_client_request_id, check_feedback, check_request_id, decode_query,
)

LOG = get_logger("frontdoor")
TIER_ENUM = {"A": pb2.TIER_A, "B": pb2.TIER_B, "C": pb2.TIER_C}
FINISHED = ("done", "error")
REQUEST_ID_METADATA = "x-request-id"
# While replaying a request another front door is still waiting for and no result handle exists.
POLL_INTERVAL_S = (0.05, 1.0)
# Threads for short blocking calls (SQL, enqueue, queue depth).
IO_THREADS = 16


class Failure(Exception):
    """Ends an RPC with `code` and a message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Call:
    """What one RPC learned so far, for its metrics, logs and trailing metadata."""

    method: str
    started: float
    tier: str = "none"
    request_id: str | None = None

    def bind(self, **values: Any) -> None:
        if "request_id" in values:
            self.request_id = values["request_id"]
        structlog.contextvars.bind_contextvars(**values)


def status_for_error_code(error_code: str | None) -> grpc.StatusCode:
    """The gRPC status a worker's recorded error maps to (INTERNAL unless it names another)."""
    if error_code:
        code = getattr(grpc.StatusCode, error_code.upper(), None)
        if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
            return code
    return grpc.StatusCode.INTERNAL


def build_reply(
    request_id: str, decision: Mapping[str, Any], result: Mapping[str, Any], total_ms: float | None,
    replayed: bool,
) -> pb2.AnswerReply:
    """The AnswerReply from a decision and a result (worker dict or stored row, same keys)."""
    timings = result.get("timings") or {}
    classify_ms = float(decision.get("classify_ms") or 0.0)
    queue_wait_ms = float(timings.get("queue_wait_ms") or 0.0)
    strategy_ms = float(timings.get("strategy_ms") or 0.0)
    if total_ms is None:  # a stored reply: the time the work itself took
        total_ms = classify_ms + queue_wait_ms + strategy_ms
    tier = result.get("tier") or decision.get("tier")
    return pb2.AnswerReply(
        request_id=request_id,
        answer=result.get("answer") or "",
        tier=TIER_ENUM.get(str(tier), pb2.TIER_UNSPECIFIED),
        strategy=result.get("strategy") or decision.get("strategy") or "",
        steps=int(result.get("steps") or 0),
        sources=[
            pb2.Source(id=str(s.get("id", "")), title=str(s.get("title", "")), score=float(s.get("score") or 0.0))
            for s in (result.get("sources") or [])
        ],
        classifier=pb2.ClassifierInfo(
            probabilities={k: float(v) for k, v in (decision.get("probabilities") or {}).items()},
            model_name=decision.get("model_name") or "",
            model_version=int(decision.get("model_version") or 0),
            fallback=bool(decision.get("fallback")),
            reason=decision.get("reason") or "",
        ),
        timings=pb2.Timings(
            classify_ms=classify_ms, queue_wait_ms=queue_wait_ms, strategy_ms=strategy_ms,
            total_ms=total_ms,
        ),
        replayed=replayed,
    )


class FrontDoor(pb2_grpc.AdaptiveRagServicer):
    """The servicer: every method runs through `_run` (status mapping, metrics, logs)."""

    def __init__(
        self, settings: Settings, store: Store, dispatcher: Dispatcher, router: ClassifierRouter,
        metrics: FrontDoorMetrics | None = None,
        sample: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.router = router
        self.metrics = metrics or FrontDoorMetrics()
        # Two pools: Answers waiting for results (long) never hold up the short calls (database,
        # enqueue, queue depth) that every other request needs.
        self.wait_executor = ThreadPoolExecutor(
            settings.frontdoor_wait_threads, thread_name_prefix="frontdoor-wait"
        )
        self.io_executor = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="frontdoor-io")
        self._sample = sample

    # --- plumbing --------------------------------------------------------------------------------

    async def _blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A short blocking call (database, broker) off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.io_executor, functools.partial(fn, *args, **kwargs))

    async def _waiting(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A long blocking wait (a result) on the wait pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.wait_executor, functools.partial(fn, *args))

    async def _run(
        self, method: str, context: grpc.aio.ServicerContext, body: Callable[[Call], Awaitable[Any]],
    ) -> Any:
        call = Call(method, time.perf_counter())
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(method=method)
        code, message, reply = grpc.StatusCode.OK, "", None
        try:
            reply = await body(call)
        except Unauthenticated as exc:
            code, message = grpc.StatusCode.UNAUTHENTICATED, str(exc)
        except InvalidArgument as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except Failure as exc:
            code, message = exc.code, exc.message
        except asyncio.CancelledError:
            code, message = grpc.StatusCode.CANCELLED, "client went away"
            raise
        except Exception:  # noqa: BLE001 - a bug must not leak as a hang or a traceback
            LOG.exception("rpc_failed")
            code, message = grpc.StatusCode.INTERNAL, "internal error in the front door (see its logs)"
        finally:
            elapsed = time.perf_counter() - call.started
            self.metrics.observe(method, call.tier, code.name, elapsed)
            log = LOG.info if code in (grpc.StatusCode.OK,) else LOG.warning
            log("rpc", code=code.name, tier=call.tier, ms=round(1000 * elapsed, 2),
                **({"detail": message} if message else {}))
        trailing = ((REQUEST_ID_METADATA, call.request_id),) if call.request_id else ()
        if code is grpc.StatusCode.OK:
            if trailing:
                context.set_trailing_metadata(trailing)
            return reply
        await context.abort(code, message, trailing_metadata=trailing)

    async def _tenant(self, context: grpc.aio.ServicerContext, call: Call) -> str:
        key = bearer_token(context.invocation_metadata())
        tenant = await self._blocking(self.store.tenant_for_key, key)
        if tenant is None:
            raise Unauthenticated("unknown or revoked API key")
        call.bind(tenant=tenant)
        return tenant

    def _deadline(self, context: grpc.aio.ServicerContext) -> float:
        """Monotonic time by which Answer must reply, leaving the margin before the client's."""
        remaining = context.time_remaining()
        if remaining is None:
            return time.monotonic() + self.settings.default_wait_s
        return time.monotonic() + max(0.0, remaining - self.settings.deadline_margin_s)

    # --- Answer ----------------------------------------------------------------------------------

    async def Answer(self, request, context):  # noqa: N802 - gRPC method name
        return await self._run("Answer", context, lambda call: self._answer(request, context, call))

    async def _answer(self, request, context, call: Call) -> pb2.AnswerReply:
        tenant = await self._tenant(context, call)
        query = decode_query(request.query, self.settings.max_query_chars)
        client_request_id = (
            check_client_request_id(request.client_request_id)
            if request.HasField("client_request_id") else None
        )
        deadline = self._deadline(context)
        if client_request_id is not None:
            existing = await self._blocking(self.store.find_request, tenant, client_request_id)
            if existing is not None:
                return await self._replay(call, as_mapping(existing), query, deadline)
        request_id = uuid.uuid4().hex
        call.bind(request_id=request_id)
        try:
            await self._blocking(self.store.create_request, request_id, tenant, client_request_id, query)
        except DuplicateRequestError:  # another replica took this client_request_id just now
            existing = await self._blocking(self.store.find_request, tenant, client_request_id)
            return await self._replay(call, as_mapping(existing), query, deadline)
        decision = await self._classify_and_record(request_id, query)
        return await self._admit(call, request_id, query, decision, deadline, replayed=False)

    async def _classify_and_record(self, request_id: str, query: str) -> dict[str, Any]:
        start = time.perf_counter()
        routed: Routed = await self.router.route(query)
        classify_ms = 1000 * (time.perf_counter() - start)
        d = routed.decision
        decision = {
            "tier": d.tier.value, "strategy": strategy_for_tier(d.tier, self.settings),
            "probabilities": d.probabilities, "model_name": routed.model_name,
            "model_version": routed.model_version, "fallback": d.fallback, "reason": d.reason,
            "classify_ms": classify_ms,
        }
        self.metrics.routed.labels(d.tier.value, str(d.fallback).lower()).inc()
        if d.fallback:
            self.metrics.fallbacks.inc()
        await self._blocking(self.store.record_decision, request_id, **decision)
        LOG.info("routed", tier=d.tier.value, fallback=d.fallback, model_version=routed.model_version,
                 classify_ms=round(classify_ms, 2), reason=d.reason)
        return decision

    async def _admit(
        self, call: Call, request_id: str, query: str, decision: Mapping[str, Any], deadline: float,
        replayed: bool,
    ) -> pb2.AnswerReply:
        """Queue-depth check, enqueue (+ shadow), wait; the decision is already recorded."""
        tier, strategy = decision["tier"], decision["strategy"]
        call.tier = tier
        queue = self.dispatcher.queue_for_tier[tier]
        limit = self.settings.max_queue_depth(tier)
        depth = await self._blocking(self.dispatcher.queue_depth, queue)
        self.metrics.queue_depth.labels(queue).set(depth)
        if depth >= limit:
            await self._blocking(self.store.set_status, request_id, "rejected")
            self.metrics.rejected.labels(tier).inc()
            raise Failure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tier {tier} queue '{queue}' holds {depth} tasks (limit {limit}); retry later "
                f"(with the same client_request_id to keep request {request_id})",
            )
        handle = await self._blocking(self.dispatcher.enqueue, request_id, query, tier, strategy)
        await self._maybe_shadow(request_id, query, tier)
        result = await self._wait(request_id, handle, deadline)
        total_ms = 1000 * (time.perf_counter() - call.started)
        return build_reply(request_id, decision, result, total_ms, replayed)

    async def _maybe_shadow(self, request_id: str, query: str, tier: str) -> None:
        share = self.settings.shadow_share
        if share <= 0.0 or self._sample() >= share:
            return
        shadow = neighbour_tier(tier)
        strategy = strategy_for_tier(Tier(shadow), self.settings)
        try:
            await self._blocking(self.dispatcher.enqueue, request_id, query, shadow, strategy, "shadow")
            LOG.info("shadow_enqueued", shadow_tier=shadow, strategy=strategy)
        except Exception as exc:  # noqa: BLE001 - a shadow run is optional; the answer is not
            LOG.warning("shadow_enqueue_failed", shadow_tier=shadow, error=str(exc))

    async def _wait(self, request_id: str, handle: Any, deadline: float) -> Mapping[str, Any]:
        """The worker's result dict within the deadline; errors and timeouts become Failures."""
        budget = deadline - time.monotonic()
        if budget <= 0:
            raise _deadline_failure(request_id, 0.0)
        try:
            if getattr(self.dispatcher, "awaits_results", False):
                result = await self.dispatcher.await_result(handle, budget)
            else:
                # Celery's blocking wait can overshoot its timeout (it drains its result consumer
                # in 1 s steps), so the budget is enforced here too; a late thread ends idle.
                result = await asyncio.wait_for(
                    self._waiting(self.dispatcher.wait_result, handle, budget), budget
                )
        except TimeoutError:
            raise _deadline_failure(request_id, budget) from None
        return _raise_recorded_error(request_id, as_mapping(result))

    async def _replay(
        self, call: Call, existing: Mapping[str, Any], query: str, deadline: float,
    ) -> pb2.AnswerReply:
        """A repeated client_request_id: the stored reply, or wait for the run in progress.

        A request that never ran (rejected because its queue was full, or the front door stopped
        before routing it) is admitted now under its original request id.
        """
        request_id = existing["request_id"]
        call.bind(request_id=request_id, replay=True)
        if existing.get("query") is not None and existing["query"] != query:
            raise Failure(
                grpc.StatusCode.ALREADY_EXISTS,
                f"client_request_id {existing.get('client_request_id')!r} was already used for a "
                f"different query (request {request_id})",
            )
        decision = as_mapping(await self._blocking(self.store.decision_for, request_id))
        status = existing.get("status")
        if not decision or status in NEVER_RAN:
            if not decision:
                decision = await self._classify_and_record(request_id, query)
            await self._blocking(self.store.set_status, request_id, "queued")
            return await self._admit(call, request_id, query, decision, deadline, replayed=False)
        call.tier = decision["tier"]
        if status in FINISHED:
            result = await self._stored_result(request_id)
        else:
            result = await self._wait_existing(request_id, deadline)
        return build_reply(request_id, decision, result, None, replayed=True)

    async def _stored_result(self, request_id: str) -> Mapping[str, Any]:
        stored = await self._blocking(self.store.get_result, request_id)
        if stored is None:
            raise Failure(grpc.StatusCode.INTERNAL, f"request {request_id} is finished but has no result row")
        return _raise_recorded_error(request_id, as_mapping(stored))

    async def _wait_existing(self, request_id: str, deadline: float) -> Mapping[str, Any]:
        """Wait for a run started by an earlier call: via its task handle, else the stored row."""
        handle = await self._blocking(self.dispatcher.handle_for, request_id, "primary")
        if handle is not None:
            return await self._wait(request_id, handle, deadline)
        delay = POLL_INTERVAL_S[0]
        while True:
            stored = await self._blocking(self.store.get_result, request_id)
            if stored is not None:
                return _raise_recorded_error(request_id, as_mapping(stored))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _deadline_failure(request_id, None)
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, POLL_INTERVAL_S[1])

    # --- GetResult -------------------------------------------------------------------------------

    async def GetResult(self, request, context):  # noqa: N802
        return await self._run("GetResult", context, lambda call: self._get_result(request, context, call))

    async def _get_result(self, request, context, call: Call) -> pb2.AnswerReply:
        tenant = await self._tenant(context, call)
        request_id = check_request_id(request.request_id)
        view = as_mapping(await self._blocking(self.store.get_request, request_id))
        if not view or view.get("tenant") != tenant:
            raise Failure(grpc.StatusCode.NOT_FOUND, f"no request {request_id} for this API key's tenant")
        call.bind(request_id=request_id)
        decision = as_mapping(await self._blocking(self.store.decision_for, request_id))
        if decision:
            call.tier = decision["tier"]
        status = view.get("status")
        if status in FINISHED and decision:
            return build_reply(request_id, decision, await self._stored_result(request_id), None, True)
        if status in NEVER_RAN:
            raise Failure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"request {request_id} was {status} and never ran; send the Answer again "
                "(with the same client_request_id to keep this request id)",
            )
        raise Failure(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"request {request_id} is still {status}; call GetResult again later",
        )

    # --- SubmitFeedback --------------------------------------------------------------------------

    async def SubmitFeedback(self, request, context):  # noqa: N802
        return await self._run("SubmitFeedback", context, lambda call: self._feedback(request, context, call))

    async def _feedback(self, request, context, call: Call) -> pb2.FeedbackReply:
        tenant = await self._tenant(context, call)
        request_id = check_request_id(request.request_id)
        correct = request.correct_answer if request.HasField("correct_answer") else None
        comment = request.comment if request.HasField("comment") else None
        check_feedback(request.rating, correct, comment)
        call.bind(request_id=request_id)
        try:
            feedback_id = await self._blocking(
                self.store.add_feedback, request_id, tenant, request.rating, correct, comment
            )
        except RequestNotFoundError:
            raise Failure(
                grpc.StatusCode.NOT_FOUND, f"no request {request_id} for this API key's tenant"
            ) from None
        LOG.info("feedback", rating=request.rating, feedback_id=feedback_id)
        return pb2.FeedbackReply(feedback_id=int(feedback_id))

    # --- background ------------------------------------------------------------------------------

    async def watch_queues(self, interval_s: float = 5.0) -> None:
        """Keep the queue-depth gauge current for every queue, not only the ones queried."""
        while True:
            for queue in (*self.dispatcher.queue_for_tier.values(), "shadow"):
                try:
                    depth = await self._blocking(self.dispatcher.queue_depth, queue)
                    self.metrics.queue_depth.labels(queue).set(depth)
                except Exception as exc:  # noqa: BLE001 - the broker may be briefly away
                    LOG.warning("queue_depth_failed", queue=queue, error=str(exc))
            await asyncio.sleep(interval_s)


def _deadline_failure(request_id: str, budget: float | None) -> Failure:
    waited = f" within {budget:.2f} s" if budget is not None else ""
    return Failure(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"no answer{waited}; request {request_id} keeps running: GetResult(request_id=\"{request_id}\")",
    )


def _raise_recorded_error(request_id: str, result: Mapping[str, Any]) -> Mapping[str, Any]:
    if result.get("error") or result.get("error_code"):
        raise Failure(
            status_for_error_code(result.get("error_code")),
            f"request {request_id} failed in the worker: {result.get('error') or result.get('error_code')}",
        )
    return result


@dataclass
class RunningServer:
    """A started front door: the grpc.aio server, its bound port and the servicer."""

    server: grpc.aio.Server
    port: int
    servicer: FrontDoor
    health: health.aio.HealthServicer
    tasks: list[asyncio.Task]

    async def stop(self, grace: float | None = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        for task in self.tasks:
            task.cancel()
        await self.server.stop(grace)
        stop_dispatcher = getattr(self.servicer.dispatcher, "stop", None)
        if stop_dispatcher is not None:
            await stop_dispatcher()
        self.servicer.router.close()
        self.servicer.wait_executor.shutdown(wait=False, cancel_futures=True)
        self.servicer.io_executor.shutdown(wait=False, cancel_futures=True)


async def start_server(
    settings: Settings, store: Store, dispatcher: Dispatcher, router: ClassifierRouter,
    metrics: FrontDoorMetrics | None = None, listen: str | None = None,
    poll_models: bool = True, queue_watch_s: float | None = 5.0,
    sample: Callable[[], float] = random.random,
) -> RunningServer:
    """Build, bind and start the server (health + reflection included); `listen` may end in :0."""
    start_dispatcher = getattr(dispatcher, "start", None)
    if start_dispatcher is not None:  # e.g. the Redis result waiter, bound to this event loop
        await start_dispatcher()
    servicer = FrontDoor(settings, store, dispatcher, router, metrics, sample=sample)
    server = grpc.aio.server()
    pb2_grpc.add_AdaptiveRagServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(listen or settings.grpc_listen)
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen or settings.grpc_listen}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    tasks = []
    if poll_models:
        tasks.append(asyncio.create_task(router.poll_forever(), name="model-poll"))
    if queue_watch_s:
        tasks.append(asyncio.create_task(servicer.watch_queues(queue_watch_s), name="queue-watch"))
    LOG.info("listening", port=port, model_version=router.version)
    return RunningServer(server, port, servicer, health_servicer, tasks)
