"""Answering a client's query, reading a stored reply, taking feedback: the front door's use cases.

One Answer: authenticate (API key -> tenant and scopes) -> validate -> the tenant has a knowledge
base (`KnowledgeBaseMissingError`) -> classify (router: Triton + policy, rules fallback) -> record
the request and its decision, which is also the idempotency check: the insert finds an earlier
request with the same (tenant, client_request_id) and the call replays it -> check the tier
queue's depth (`QueueFullError` when full) and the tenant's fair share (`OverShareError`) ->
enqueue on the tier's queue (and, for a sampled share, a shadow run on the neighbouring tier) ->
wait for the result within the deadline (`AnswerTimeoutError` while the work continues;
`get_result` returns it later). A live reply and a replayed one are the same `Answered`, built from the same types.

No request waits forever: one still queued past `queued_expiry_s` (its message lost, or never
picked up) is expired by `expire_stale`, and a resend runs it again, as it does one that never ran
(rejected) or whose run ended because a dependency was away (`RETRYABLE_ERRORS`).

Records and broker calls block (SQLAlchemy, kombu); they run on a small thread pool so the event
loop stays free. A new request's insert, queue-depth check, fair share and enqueue are one unit on
one thread (`_queue`): each hop between the loop and a thread waits for the GIL, which under load
costs more than the round trips themselves; the slot is given back without holding up the reply.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from sqlalchemy.exc import InterfaceError, OperationalError

from adaptive_rag.contracts import (
    FINISHED, NEVER_RAN, RETRYABLE_ERRORS, SHADOW_TIER, SMALL_TALK_MODEL, AnswerResult, AnswerTask,
    Principal, RequestStatus, ResultKind, RoutingDecision, Scope, Tier, task_id_for,
)
from adaptive_rag.errors import (
    AnswerFailedError, AnswerTimeoutError, ClientRequestIdReusedError, DependencyUnavailableError,
    DuplicateRequestError,
    KnowledgeBaseMissingError, OverShareError, PermissionDeniedError, QueueFullError,
    RequestNotFinishedError, RequestNotFoundError, UnauthenticatedError,
)
from adaptive_rag.routing.rules import escalate_two_questions
from adaptive_rag.routing.small_talk import small_talk_intent
from adaptive_rag.serving.ports import FairShare, Records, ResultWaiter, Router, TaskQueue
from adaptive_rag.serving.queue_delay import DepthEstimate, QueueDelayGate, Standing
from adaptive_rag.strategies import SMALL_TALK
from adaptive_rag.storage.records import RequestView
from adaptive_rag.tracing import span
from adaptive_rag.validation import (
    check_client_request_id, check_feedback, check_request_id, decode_query,
)

LOG = structlog.get_logger("serving.admission")
# Threads for the blocking records and broker calls (one hop per admission); see the front
# door's `io_threads` setting for why four.
IO_THREADS = 4
T = TypeVar("T")


@dataclass(frozen=True)
class AdmissionConfig:
    """What admission needs to know; the front door builds it from its settings once.

    `key_cache_s`: how long a known API key's tenant is remembered (0: ask the records every
    time); a revoked key keeps working that long on a replica that saw it. The same time bounds
    how long a tenant's knowledge base is taken to exist once seen.
    """

    max_query_chars: int
    max_queue_depth: Mapping[Tier, int]
    strategy_for: Callable[[Tier], str]
    shadow_share: float = 0.0
    key_cache_s: float = 0.0
    small_talk: bool = True
    two_questions_to_c: bool = True  # a query asking two questions goes to C (`rules.asks_two_questions`)
    # How long a fair-share slot may stay held by work still running (the tier's lease).
    slot_lease_s: Mapping[Tier, float] = field(default_factory=dict)
    # A request still queued this long was never started: `expire_stale` expires it (None: never).
    queued_expiry_s: float | None = None
    # Wait budget per tier (`queue_delay.QueueDelayGate`); a tier left out is limited by length only.
    queue_wait_target_s: Mapping[Tier, float] = field(default_factory=dict)
    queue_wait_interval_s: float = 1.0
    # How old a tier queue's depth read may be before an admission reads it again
    # (`queue_delay.DepthEstimate`; 0: read on every admission).
    depth_max_age_s: float = 0.0
    io_threads: int = IO_THREADS


V = TypeVar("V")


class TtlCache(Generic[V]):
    """Recently confirmed facts (the principal of a known API key, a tenant that has a knowledge
    base), each kept `ttl_s`. Only positive answers go in: an unknown key is always looked up,
    so guessing keys cannot fill the cache, and a new knowledge base is seen at once."""

    def __init__(self, ttl_s: float, max_items: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._clock = clock
        self._items: OrderedDict[str, tuple[V, float]] = OrderedDict()

    def get(self, key: str) -> V | None:
        found = self._items.get(key)
        if found is None:
            return None
        value, expires = found
        if self._clock() >= expires:
            del self._items[key]
            return None
        return value

    def put(self, key: str, value: V) -> None:
        if self.ttl_s <= 0:
            return
        self._items[key] = (value, self._clock() + self.ttl_s)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)


@dataclass
class CallProgress:
    """What one call learned so far; the edge reads it for metrics, logs and trailing metadata
    even when the call ends in an error. `stages` holds milliseconds per stage of the call
    (authenticate, validate, idempotency, classify, record, admit, enqueue, wait)."""

    request_id: str | None = None
    tier: Tier | None = None
    stages: dict[str, float] = field(default_factory=dict)

    def bind(self, **values: Any) -> None:
        if "request_id" in values:
            self.request_id = values["request_id"]
        structlog.contextvars.bind_contextvars(**values)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the stage (and trace it: a `serving.<name>` span of the call's trace)."""
        start = time.perf_counter()
        try:
            with span(f"serving.{name}"):
                yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + 1000 * (time.perf_counter() - start)


@dataclass(frozen=True)
class Routed:
    """A recorded routing decision (the Route use case): its id is a request id."""

    decision_id: str
    decision: RoutingDecision


@dataclass(frozen=True)
class Answered:
    """A reply: the routing decision and the worker's result, live or stored."""

    request_id: str
    decision: RoutingDecision
    result: AnswerResult
    total_ms: float  # receipt to reply; for a stored reply the work's own time
    replayed: bool

    @classmethod
    def stored(cls, request_id: str, decision: RoutingDecision, result: AnswerResult) -> Answered:
        work_ms = decision.classify_ms + result.timings.queue_wait_ms + result.timings.strategy_ms
        return cls(request_id, decision, result, work_ms, replayed=True)


class AnswerService:
    """The use cases over the ports: `answer`, `get_result`, `submit_feedback`."""

    def __init__(
        self, records: Records, queue: TaskQueue, waiter: ResultWaiter, router: Router,
        config: AdmissionConfig, has_knowledge_base: Callable[[str], bool],
        fair_share: FairShare | None = None, sample: Callable[[], float] = random.random,
        on_routed: Callable[[RoutingDecision], None] = lambda decision: None,
        on_rejected: Callable[[Tier], None] = lambda tier: None,
        on_queue_depth: Callable[[str, int], None] = lambda queue, depth: None,
        on_expired: Callable[[int], None] = lambda count: None,
    ) -> None:
        self.records = records
        self.queue = queue
        self.waiter = waiter
        self.router = router
        self.config = config
        self._sample = sample
        self._on_routed = on_routed
        self._on_rejected = on_rejected
        self._on_queue_depth = on_queue_depth
        self._on_expired = on_expired
        self._has_knowledge_base = has_knowledge_base
        self.fair_share = fair_share
        self._io_pool = ThreadPoolExecutor(config.io_threads, thread_name_prefix="serving-io")
        self.delay_gate = QueueDelayGate(config.queue_wait_target_s, config.queue_wait_interval_s)
        self._depths = DepthEstimate(config.depth_max_age_s)
        self._keys: TtlCache[Principal] = TtlCache(config.key_cache_s)
        self._knowledge: TtlCache[bool] = TtlCache(config.key_cache_s)
        self._watchers: set[asyncio.Task] = set()

    def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        self._io_pool.shutdown(wait=False, cancel_futures=True)

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """A short blocking call (records, broker) off the event loop; a database that does not
        answer is `DependencyUnavailableError` (the caller may retry), not a bug."""
        loop = asyncio.get_running_loop()
        # The call's context goes along (its trace: an enqueue carries it in the task's headers).
        context = contextvars.copy_context()
        try:
            return await loop.run_in_executor(self._io_pool, functools.partial(context.run, fn, *args))
        except (OperationalError, InterfaceError) as exc:
            raise DependencyUnavailableError(
                f"the records database is unreachable ({type(exc.orig or exc).__name__})") from exc

    async def authenticate(self, api_key: str, progress: CallProgress, scope: Scope | None = None) -> Principal:
        """The caller's tenant and scopes; with `scope`, a key without it is refused."""
        with progress.stage("authenticate"):
            principal = self._keys.get(api_key)
            if principal is None:
                principal = await self._io(self.records.principal_for_key, api_key)
                if principal is not None:
                    self._keys.put(api_key, principal)
        if principal is None:
            raise UnauthenticatedError("unknown or revoked API key")
        progress.bind(tenant=principal.tenant)
        if scope is not None and not principal.allows(scope):
            granted = ", ".join(sorted(s.value for s in principal.scopes))
            raise PermissionDeniedError(f"this API key may not {scope.value!r} (its scopes: {granted})")
        return principal

    async def require_knowledge_base(self, tenant: str) -> None:
        if self._knowledge.get(tenant):
            return
        if not await self._io(self._has_knowledge_base, tenant):
            raise KnowledgeBaseMissingError(
                f"tenant {tenant!r} has no knowledge base yet: import its documents first "
                "(KnowledgeBase.UpsertDocuments, or `arag kb import --tenant ...`)"
            )
        self._knowledge.put(tenant, True)

    # --- Answer ----------------------------------------------------------------------------------

    async def answer(
        self, api_key: str, raw_query: bytes, client_request_id: str | None, deadline: float,
        progress: CallProgress,
    ) -> Answered:
        """`deadline` is a `time.monotonic()` instant by which the reply must be sent."""
        started = time.perf_counter()
        tenant = (await self.authenticate(api_key, progress, Scope.ANSWER)).tenant
        with progress.stage("validate"):
            query = decode_query(raw_query, self.config.max_query_chars)
            if client_request_id is not None:
                client_request_id = check_client_request_id(client_request_id)
        with progress.stage("knowledge"):
            await self.require_knowledge_base(tenant)
        request_id = uuid.uuid4().hex
        # Classified before the idempotency check: the request and its decision are then one
        # insert that is the check too (a resent request costs a classification it does not use;
        # a new one saves a round trip to the records).
        decision = await self._classify(query, tenant, progress)
        progress.bind(request_id=request_id)
        record = functools.partial(self.records.create_request, request_id, tenant, client_request_id,
                                   query, RequestStatus.QUEUED, decision)
        try:
            await self._queue(request_id, tenant, query, decision, progress, record=record)
        except DuplicateRequestError:  # this client_request_id was sent before (or just now)
            with progress.stage("idempotency"):
                existing = await self._io(self.records.find_request, tenant, client_request_id)
            if existing is None:  # only a request id collision could get here
                raise
            return await self._replay(existing, query, deadline, progress, started)
        return await self._answer_when_done(request_id, tenant, query, decision, deadline,
                                            progress, started)

    async def _classify(self, query: str, tenant: str, progress: CallProgress) -> RoutingDecision:
        """The router's decision for `tenant` (its prior, if any, shifts the classifier's) with
        the strategy and the time it took (not yet recorded).

        A small-talk turn ("hi", "thanks!", "are you a bot?") is tier A without asking the
        classifier, answered by the small-talk strategy (a short reply, no retrieval, no LLM). A
        query asking two questions goes to C whatever the router says (`escalate_two_questions`).
        """
        start = time.perf_counter()
        with progress.stage("classify"):
            chat = small_talk_intent(query) if self.config.small_talk else None
            if chat is not None:
                routed = RoutingDecision(tier=Tier.A, model_name=SMALL_TALK_MODEL,
                                         reason=f"small talk ({chat.intent})", strategy=SMALL_TALK)
            else:
                routed = await self.router.route(query, tenant)
                if self.config.two_questions_to_c:
                    routed = escalate_two_questions(query, routed)
        decision = routed.model_copy(update={
            "strategy": routed.strategy or self.config.strategy_for(routed.tier),
            "classify_ms": 1000 * (time.perf_counter() - start),
        })
        progress.tier = decision.tier
        return decision

    def _routed(self, decision: RoutingDecision) -> None:
        """Count and log a decision once it is recorded (a replay's unused one is not)."""
        self._on_routed(decision)
        LOG.info("routed", tier=decision.tier.value, fallback=decision.fallback,
                 model_version=decision.model_version, classify_ms=round(decision.classify_ms, 2),
                 reason=decision.reason)

    async def _classify_and_record(
        self, request_id: str, tenant: str, query: str, progress: CallProgress,
    ) -> RoutingDecision:
        decision = await self._classify(query, tenant, progress)
        with progress.stage("record"):
            await self._io(self.records.record_decision, request_id, decision)
        self._routed(decision)
        return decision

    async def _admit(
        self, request_id: str, tenant: str, query: str, decision: RoutingDecision, deadline: float,
        progress: CallProgress, started: float,
    ) -> Answered:
        """Queue a request whose decision is recorded, and wait for its answer."""
        await self._queue(request_id, tenant, query, decision, progress)
        return await self._answer_when_done(request_id, tenant, query, decision, deadline,
                                            progress, started)

    async def _queue(
        self, request_id: str, tenant: str, query: str, decision: RoutingDecision,
        progress: CallProgress, record: Callable[[], object] | None = None,
    ) -> None:
        """`record` (the new request's insert), then the queue-depth and fair-share checks and
        the enqueue, as one blocking unit on one I/O thread: each hop between the event loop and
        a thread waits for the GIL, and under load those waits cost an admission more than its
        round trips do. The wait budget's verdict is read first, on the event loop (the gate's
        state lives there)."""
        progress.tier = decision.tier
        standing = self.delay_gate.standing(decision.tier)
        try:
            await self._io(self._queue_blocking, request_id, tenant, query, decision, standing,
                           progress, record)
        except asyncio.CancelledError:  # the client left; the thread goes on and may queue it
            self._release_when_done(tenant, decision.tier, request_id)
            raise

    def _queue_blocking(
        self, request_id: str, tenant: str, query: str, decision: RoutingDecision,
        standing: Standing | None, progress: CallProgress, record: Callable[[], object] | None,
    ) -> None:
        """`_queue`'s blocking part. A refusal marks the request `rejected` before it is raised
        (a resend with its client_request_id admits it again): `QueueFullError` (the tier queue
        at its length limit, or its wait budget standing), `OverShareError`,
        `DependencyUnavailableError` (the broker away). `DuplicateRequestError` comes from
        `record`, before anything else happened."""
        if record is not None:
            with progress.stage("record"):
                record()
            self._routed(decision)
        tier = decision.tier
        queue = self.queue.queue_name(tier)
        limit = self.config.max_queue_depth[tier]
        try:
            with progress.stage("admit"):
                depth, read_now = self._depths.depth(queue, self.queue.depth)
        except DependencyUnavailableError as exc:
            raise self._did_not_run(request_id, exc) from exc
        if read_now:
            self._on_queue_depth(queue, depth)
        standing = standing if depth > 0 else None  # an empty queue stands for nothing
        if depth >= limit or standing is not None:
            self._reject(request_id, tier)
            why = (f"holds {depth} tasks (limit {limit})" if standing is None else
                   f"stands: even the shortest wait of its last {standing.samples} finished tasks "
                   f"({standing.interval_s:g} s) was {standing.shortest_wait_s:.2f} s (target "
                   f"{standing.target_s:g} s); {depth} tasks queued")
            raise QueueFullError(
                f"tier {tier.value} queue '{queue}' {why}; retry later "
                f"(with the same client_request_id to keep request {request_id})"
            )
        if self.fair_share is not None:
            try:
                with progress.stage("fair_share"):
                    self.fair_share.acquire(tenant, tier, request_id)
            except OverShareError:
                self._reject(request_id, tier)
                raise
        task = AnswerTask(request_id=request_id, tenant=tenant, query=query, tier=tier,
                          strategy=decision.strategy, enqueued_at=time.time())
        try:
            with progress.stage("enqueue"):
                self.queue.enqueue(task)
        except BaseException as exc:  # nothing was queued: the slot is free at once
            self._release_blocking(tenant, tier, request_id)
            if isinstance(exc, DependencyUnavailableError):
                raise self._did_not_run(request_id, exc) from exc
            raise
        self._depths.added(queue)

    def _reject(self, request_id: str, tier: Tier) -> None:
        """Mark a refused request `rejected` (a resend admits it again) and count it (blocking)."""
        self.records.set_status(request_id, RequestStatus.REJECTED)
        self._on_rejected(tier)

    async def _answer_when_done(
        self, request_id: str, tenant: str, query: str, decision: RoutingDecision, deadline: float,
        progress: CallProgress, started: float,
    ) -> Answered:
        """The queued request's answer within the deadline (and a sampled shadow run). The
        tenant's slot is given back once the work ended, without holding up the reply."""
        tier = decision.tier
        try:
            if decision.strategy != SMALL_TALK:  # nothing to learn from a greeting
                await self._maybe_shadow(request_id, tenant, query, tier)
            with progress.stage("wait"):
                result = await self._wait(request_id, deadline)
            # What the queue made this task wait, as it happened (a replay's or a GetResult's
            # old result would tell about the past).
            self.delay_gate.observe(tier, result.timings.queue_wait_ms / 1000.0)
        except AnswerFailedError:  # the worker finished, with an error
            self._release_soon(tenant, tier, request_id)
            raise
        except BaseException:  # the deadline passed or the client left: the work goes on
            self._release_when_done(tenant, tier, request_id)
            raise
        self._release_soon(tenant, tier, request_id)
        return Answered(request_id, decision, result, 1000 * (time.perf_counter() - started), False)

    def _did_not_run(self, request_id: str, cause: Exception) -> DependencyUnavailableError:
        """Mark a request that could not be queued as never run (a resend with its
        client_request_id admits it again) and say so to the caller (blocking)."""
        try:
            self.records.set_status(request_id, RequestStatus.REJECTED)
        except Exception as exc:  # noqa: BLE001 - the records may be down too; the resend fixes it
            LOG.warning("mark_not_run_failed", error=str(exc))
        return DependencyUnavailableError(
            f"{cause}; request {request_id} did not run: send it again (with the same "
            "client_request_id to keep this request id)")

    def _release_when_done(self, tenant: str, tier: Tier, request_id: str) -> None:
        """Give the slot back when the work that still runs ends (in the background: the caller's
        deadline passed or it left); if no result comes within the lease, the lease ends it."""
        if self.fair_share is None:
            return

        async def when_done() -> None:
            try:
                await self.waiter.wait(task_id_for(request_id), self.config.slot_lease_s.get(tier, 600.0))
            except Exception:  # noqa: BLE001 - no result within the lease: the lease frees the slot
                return
            await self._release(tenant, tier, request_id)

        watcher = asyncio.get_running_loop().create_task(when_done(), name=f"release-{request_id}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    def _release_blocking(self, tenant: str, tier: Tier, request_id: str) -> None:
        """Give the tenant's slot back; never raises (a slot not given back ends with its lease)."""
        if self.fair_share is None:
            return
        try:
            self.fair_share.release(tenant, tier, request_id)
        except Exception as exc:  # noqa: BLE001 - the lease expires on its own
            LOG.warning("fair_share_release_failed", error=str(exc))

    async def _release(self, tenant: str, tier: Tier, request_id: str) -> None:
        if self.fair_share is not None:
            await self._io(self._release_blocking, tenant, tier, request_id)

    def _release_soon(self, tenant: str, tier: Tier, request_id: str) -> None:
        """`_release` on an I/O thread, not awaited: the reply does not wait for it."""
        if self.fair_share is None:
            return
        try:
            self._io_pool.submit(self._release_blocking, tenant, tier, request_id)
        except RuntimeError:  # shutting down: the lease ends the slot
            pass

    async def _maybe_shadow(self, request_id: str, tenant: str, query: str, tier: Tier) -> None:
        share = self.config.shadow_share
        if share <= 0.0 or self._sample() >= share:
            return
        shadow = SHADOW_TIER[tier]
        task = AnswerTask(request_id=request_id, tenant=tenant, query=query, tier=shadow,
                          strategy=self.config.strategy_for(shadow), kind=ResultKind.SHADOW,
                          enqueued_at=time.time())
        try:
            await self._io(self.queue.enqueue, task)
            LOG.info("shadow_enqueued", shadow_tier=shadow.value, strategy=task.strategy)
        except Exception as exc:  # noqa: BLE001 - a shadow run is optional; the answer is not
            LOG.warning("shadow_enqueue_failed", shadow_tier=shadow.value, error=str(exc))

    async def _wait(self, request_id: str, deadline: float) -> AnswerResult:
        """The primary run's result within the deadline (its task id is the request id)."""
        budget = deadline - time.monotonic()
        if budget <= 0:
            raise _timeout(request_id, 0.0)
        try:
            result = await self.waiter.wait(task_id_for(request_id), budget)
        except TimeoutError:
            raise _timeout(request_id, budget) from None
        return _answer_or_raise(request_id, result)

    async def _replay(
        self, existing: RequestView, query: str, deadline: float, progress: CallProgress,
        started: float,
    ) -> Answered:
        """A repeated client_request_id: the stored reply, or wait for the run in progress.

        A request that never ran (rejected because its queue was full, or the front door stopped
        before routing it) is admitted now under its original request id.
        """
        request_id = existing.request_id
        progress.bind(request_id=request_id, replay=True)
        if existing.query != query:
            raise ClientRequestIdReusedError(
                f"client_request_id {existing.client_request_id!r} was already used for a "
                f"different query (request {request_id})"
            )
        decision = await self._io(self.records.decision_for, request_id)
        if decision is None:  # recorded by a front door that stopped before routing it
            decision = await self._classify_and_record(request_id, existing.tenant, query, progress)
            await self._io(self.records.set_status, request_id, RequestStatus.QUEUED)
            return await self._admit(request_id, existing.tenant, query, decision, deadline,
                                     progress, started)
        progress.tier = decision.tier
        if existing.status in NEVER_RAN or await self._failed_for_a_dependency(existing):
            if await self._readmit(request_id):
                return await self._admit(request_id, existing.tenant, query, decision, deadline,
                                         progress, started)
            # Another front door admitted it again at the same moment: follow that run.
            existing = await self._io(self.records.get_request, request_id) or existing
        if existing.status in FINISHED:
            result = await self._stored_result(request_id)
        else:
            result = await self._wait(request_id, deadline)
            await self._release(existing.tenant, decision.tier, request_id)
        return Answered.stored(request_id, decision, result)

    async def _failed_for_a_dependency(self, existing: RequestView) -> bool:
        """Whether the request's run ended with an error that may pass (a resend runs it again)."""
        if existing.status is not RequestStatus.ERROR:
            return False
        stored = await self._io(self.records.get_result, existing.request_id)
        return stored is not None and stored.error_code in RETRYABLE_ERRORS

    async def _readmit(self, request_id: str) -> bool:
        """Queue the request again (False: it may not run again, or another front door did it).

        The queue's stored result of an earlier run goes first: the new run has the same task id,
        and its waiters must not be answered by the old error. The records then delete that
        run's error row in the transaction that queues the request again.
        """
        await self._io(self.queue.forget, task_id_for(request_id))
        readmitted = await self._io(self.records.readmit, request_id)
        if readmitted:
            LOG.info("readmitted")
        return readmitted

    async def _stored_result(self, request_id: str) -> AnswerResult:
        stored = await self._io(self.records.get_result, request_id)
        if stored is None:
            raise RuntimeError(f"request {request_id} is finished but has no result row")
        return _answer_or_raise(request_id, stored)

    # --- Route -----------------------------------------------------------------------------------

    async def route(self, api_key: str, raw_query: bytes, progress: CallProgress) -> Routed:
        """Classify and record the decision; nothing is enqueued (the client runs the strategy)."""
        tenant = (await self.authenticate(api_key, progress, Scope.ANSWER)).tenant
        query = decode_query(raw_query, self.config.max_query_chars)
        request_id = uuid.uuid4().hex
        progress.bind(request_id=request_id)
        decision = await self._classify(query, tenant, progress)
        with progress.stage("record"):
            await self._io(self.records.create_request, request_id, tenant, None, query,
                           RequestStatus.ROUTED, decision)
        self._routed(decision)
        return Routed(request_id, decision)

    # --- GetResult -------------------------------------------------------------------------------

    async def get_result(self, api_key: str, request_id: str, progress: CallProgress) -> Answered:
        tenant = (await self.authenticate(api_key, progress, Scope.ANSWER)).tenant
        request_id = check_request_id(request_id)
        view = await self._io(self.records.get_request, request_id)
        if view is None or view.tenant != tenant:
            raise RequestNotFoundError(f"no request {request_id} for this API key's tenant")
        progress.bind(request_id=request_id)
        decision = await self._io(self.records.decision_for, request_id)
        if decision is not None:
            progress.tier = decision.tier
        if view.status in FINISHED and decision is not None:
            return Answered.stored(request_id, decision, await self._stored_result(request_id))
        if view.status is RequestStatus.ROUTED:
            raise RequestNotFinishedError(
                f"request {request_id} is a routing decision only (Route): nothing ran here"
            )
        if view.status in NEVER_RAN:
            raise RequestNotFinishedError(
                f"request {request_id} was {view.status.value} and never ran; send the Answer again "
                "(with the same client_request_id to keep this request id)"
            )
        raise RequestNotFinishedError(
            f"request {request_id} is still {view.status.value}; call GetResult again later"
        )

    # --- expiry ----------------------------------------------------------------------------------

    async def expire_stale(self) -> list[str]:
        """Expire the requests queued longer than `queued_expiry_s` (never started: their message
        was lost, or not picked up before their client's deadline), so GetResult says "never ran;
        send the Answer again" instead of "call again later" forever. Returns their ids (empty
        when another front door is sweeping, or expiry is off)."""
        if not self.config.queued_expiry_s:
            return []
        expired = await self._io(self.records.expire_queued, self.config.queued_expiry_s)
        if expired:
            self._on_expired(len(expired))
            LOG.warning("requests_expired", count=len(expired), request_ids=expired[:20],
                        queued_expiry_s=self.config.queued_expiry_s)
        return expired or []

    # --- SubmitFeedback --------------------------------------------------------------------------

    async def submit_feedback(
        self, api_key: str, request_id: str, rating: int, correct_answer: str | None,
        comment: str | None, progress: CallProgress,
    ) -> int:
        tenant = (await self.authenticate(api_key, progress, Scope.FEEDBACK)).tenant
        request_id = check_request_id(request_id)
        check_feedback(rating, correct_answer, comment)
        progress.bind(request_id=request_id)
        try:
            feedback_id = await self._io(
                self.records.add_feedback, request_id, tenant, rating, correct_answer, comment
            )
        except RequestNotFoundError:
            raise RequestNotFoundError(f"no request {request_id} for this API key's tenant") from None
        LOG.info("feedback", rating=rating, feedback_id=feedback_id)
        return feedback_id

    # --- health ----------------------------------------------------------------------------------

    async def dependency_problems(self) -> list[str]:
        """What keeps this front door from answering right now (empty: nothing): the records
        database and the task queue are each asked once."""
        problems = []
        for name, check in (("records database", self.records.ping),
                            ("task queue", lambda: self.queue.depth(self.queue.queue_name(Tier.A)))):
            try:
                await self._io(check)
            except Exception as exc:  # noqa: BLE001 - any failure means not serving
                problems.append(f"{name}: {exc}")
        return problems

    # --- queues ----------------------------------------------------------------------------------

    async def queue_depths(self, queues: list[str]) -> dict[str, int]:
        """Current depth of each queue (for the queue-depth gauge); unreachable ones are left out."""
        depths: dict[str, int] = {}
        for queue in queues:
            try:
                depths[queue] = await self._io(self.queue.depth, queue)
            except Exception as exc:  # noqa: BLE001 - the broker may be briefly away
                LOG.warning("queue_depth_failed", queue=queue, error=str(exc))
        for queue, depth in depths.items():
            self._on_queue_depth(queue, depth)
        return depths


def _timeout(request_id: str, budget: float) -> AnswerTimeoutError:
    waited = f" within {budget:.2f} s" if budget else ""
    return AnswerTimeoutError(
        f"no answer{waited}; request {request_id} keeps running: GetResult(request_id=\"{request_id}\")",
        request_id,
    )


def _answer_or_raise(request_id: str, result: AnswerResult) -> AnswerResult:
    if result.error_code is not None:
        # Said before the detail, which may be long (a status message is clipped at its end).
        again = (" (send the Answer again with the same client_request_id to run it again)"
                 if result.error_code in RETRYABLE_ERRORS else "")
        raise AnswerFailedError(
            f"request {request_id} failed in the worker{again}: {result.error or result.error_code.value}",
            result.error_code,
        )
    return result
