"""The Answer use case: admit a client's query, queue it on its tier and wait for the answer.

authenticate (API key -> tenant and scopes) -> validate -> the tenant has a knowledge base
(`KnowledgeBaseMissingError`) -> a follow-up in a conversation rewritten into a standalone question
(`Serving.follow_up`; another tenant's or an expired conversation: `ConversationNotFoundError`)
-> classify (router: Triton + policy, rules fallback; small talk is answered here, with no queue:
`_answer_here`) -> record the
request and its decision, which is also the idempotency check: the insert finds an earlier request
with the same (tenant, client_request_id) and the call replays it -> check the tier queue's depth
(`QueueFullError` when full) and the tenant's fair share (`OverShareError`) -> enqueue on the
tier's queue (and, for a sampled share, a shadow run on the neighbouring tier) -> wait for the
result within the deadline (`AnswerTimeoutError` while the work continues; GetResult returns it
later). A live reply and a replayed one are the same `Answered`, built from the same types.

A resend runs again a request that never ran (rejected, expired: `upkeep.expire_stale`) or whose
run ended because a dependency was away (`RETRYABLE_ERRORS`), and publishes again one still
queued whose task was never published (its front door died between the record and the enqueue).
Every Answer, a replay too, ends by its deadline: `AnswerTimeoutError` with the request id.

The request row is the outbox of its task: it is inserted with no publish mark, the task is
enqueued, and the mark is written on the records' mark thread while the call waits for the
answer (`Serving.mark_enqueued_soon`). A row never marked is published again by every front
door's relay (`upkeep.relay_unpublished`); a second publish costs a second delivery, never a
second result (`answering.write_once`).

A new request's insert, queue-depth check, fair share and enqueue are one unit on one I/O thread
(`_queue`): each hop between the loop and a thread waits for the GIL, which under load costs more
than the round trips themselves; the slot is given back without holding up the reply.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import structlog

from adaptive_rag.contracts import (
    FINISHED, NEVER_RAN, RETRYABLE_ERRORS, SHADOW_TIER, AnswerResult, AnswerTask, RequestStatus,
    RequestView, ResultKind, Scope, task_id_for,
)
from adaptive_rag.errors import (
    AnswerFailedError, AnswerTimeoutError, ClientRequestIdReusedError, DependencyUnavailableError,
    DuplicateRequestError, OverShareError, QueueFullError,
)
from adaptive_rag.serving.answering import canned_answer
from adaptive_rag.serving.commands import AdmitRequest, Answer, Answered
from adaptive_rag.serving.context import CallProgress, Serving
from adaptive_rag.serving.queue_delay import Standing
from adaptive_rag.serving.results import answer_or_raise, stored_result
from adaptive_rag.serving.slots import release, release_now, release_soon, release_when_done
from adaptive_rag.strategies import SMALL_TALK
from adaptive_rag.strategies.follow_up import Rewrite, RewriteMethod
from adaptive_rag.validation import check_client_request_id, check_conversation_id, decode_query

LOG = structlog.get_logger("serving.admission")
# A resend publishes again a queued request never marked published once it is this old; a
# younger one may be its first call's own admission, between its insert and its publish.
RESEND_PUBLISH_AFTER_S = 1.0
# Who ran a request answered at admission, as its result row records the worker.
FRONT_DOOR = "frontdoor"


async def answer(serving: Serving, command: Answer, progress: CallProgress) -> Answered:
    """The Answer use case (see the module), ended by `command.deadline` whichever step it is in
    (a records or broker call that blocks included): `AnswerTimeoutError` with the request id,
    the same reply for a new request and a replay."""
    budget = max(0.0, command.deadline - time.monotonic())
    try:
        async with asyncio.timeout(budget):
            return await _answer(serving, command, progress)
    except TimeoutError:  # the deadline came in a step before the wait (the wait raises its own)
        if progress.request_id is None:
            raise AnswerTimeoutError(f"no answer within {budget:.2f} s: the request was not "
                                     "recorded; send it again", "") from None
        raise _timeout(progress.request_id, budget) from None


async def _answer(serving: Serving, command: Answer, progress: CallProgress) -> Answered:
    started = time.perf_counter()
    tenant = (await serving.authenticate(command.api_key, progress, Scope.ANSWER)).tenant
    with progress.stage("validate"):
        query = decode_query(command.raw_query, serving.config.max_query_chars)
        client_request_id = (None if command.client_request_id is None
                             else check_client_request_id(command.client_request_id))
        conversation_id = (None if command.conversation_id is None
                           else check_conversation_id(command.conversation_id))
    with progress.stage("knowledge"):
        await serving.require_knowledge_base(tenant)
    # A follow-up is rewritten into a standalone question before anything judges it: small
    # talk, the router and the strategies all see the rewritten question.
    rewrite = await serving.follow_up(query, tenant, conversation_id, progress)
    # Classified before the idempotency check: the request and its decision are then one
    # insert that is the check too (a resent request costs a classification it may not use;
    # a new one saves a round trip to the records).
    decision = await serving.classify(rewrite.question, tenant, progress)
    request = AdmitRequest(
        request_id=uuid.uuid4().hex, tenant=tenant, query=query,
        client_request_id=client_request_id, decision=decision, deadline=command.deadline,
        started=started, progress=progress, conversation_id=conversation_id, rewrite=rewrite,
    )
    progress.bind(request_id=request.request_id)
    try:
        if decision.strategy == SMALL_TALK:
            return await _answer_here(serving, request)
        await _queue(serving, request, new=True)
    except DuplicateRequestError:  # this client_request_id was sent before (or just now)
        with progress.stage("idempotency"):
            existing = await serving.io(serving.records.find_request, tenant, client_request_id)
        if existing is None:  # only a request id collision could get here
            raise
        return await _replay(serving, request, existing)
    return await _answer_when_done(serving, request)


async def _admit(serving: Serving, request: AdmitRequest) -> Answered:
    """Queue a request whose decision is recorded, and wait for its answer."""
    await _queue(serving, request)
    return await _answer_when_done(serving, request)


async def _queue(serving: Serving, request: AdmitRequest, new: bool = False) -> None:
    """Record the request when `new`, then check the queue's depth and the fair share and
    enqueue, as one blocking unit on one I/O thread (see the module). The wait budget's verdict
    is read first, on the event loop (the gate's state lives there)."""
    request.progress.tier = request.tier
    standing = serving.delay_gate.standing(request.tier)
    try:
        await serving.io(_queue_blocking, serving, request, standing, new)
    except asyncio.CancelledError:  # the client left; the thread goes on and may queue it
        release_when_done(serving, request)
        raise


def _queue_blocking(serving: Serving, request: AdmitRequest, standing: Standing | None, new: bool) -> None:
    """`_queue`'s blocking part. A refusal marks the request `rejected` before it is raised
    (a resend with its client_request_id admits it again): `QueueFullError` (the tier queue
    at its length limit, or its wait budget standing), `OverShareError`,
    `DependencyUnavailableError` (the broker away). `DuplicateRequestError` comes from the
    new request's insert, before anything else happened."""
    progress, tier, request_id = request.progress, request.tier, request.request_id
    if new:
        with progress.stage("record"):
            serving.records.create_request(
                request_id, request.tenant, request.client_request_id, request.query,
                RequestStatus.QUEUED, request.decision, conversation_id=request.conversation_id,
                standalone_query=request.standalone_query,
                rewrite=request.rewrite.method.value if request.standalone_query else None)
        serving.on_recorded(request_id)
        serving.routed(request.decision)
    queue = serving.queue.queue_name(tier)
    limit = serving.config.max_queue_depth[tier]
    try:
        with progress.stage("admit"):
            depth, read_now = serving.depths.depth(queue, serving.queue.depth)
    except DependencyUnavailableError as exc:
        raise _did_not_run(serving, request, exc) from exc
    if read_now:
        serving.on_queue_depth(queue, depth)
    standing = standing if depth > 0 else None  # an empty queue stands for nothing
    if depth >= limit or standing is not None:
        _reject(serving, request)
        why = (f"holds {depth} tasks (limit {limit})" if standing is None else
               f"stands: even the shortest wait of its last {standing.samples} finished tasks "
               f"({standing.interval_s:g} s) was {standing.shortest_wait_s:.2f} s (target "
               f"{standing.target_s:g} s); {depth} tasks queued")
        raise QueueFullError(
            f"tier {tier.value} queue '{queue}' {why}; retry later "
            f"(with the same client_request_id to keep request {request_id})"
        )
    if serving.fair_share is not None:
        try:
            with progress.stage("fair_share"):
                serving.fair_share.acquire(request.tenant, tier, request_id)
        except OverShareError:
            _reject(serving, request)
            raise
    task = AnswerTask(request_id=request_id, tenant=request.tenant, query=request.searched_query, tier=tier,
                      strategy=request.decision.strategy, enqueued_at=time.time())
    try:
        with progress.stage("enqueue"):
            serving.queue.enqueue(task)
    except BaseException as exc:  # nothing was queued: the slot is free at once
        release_now(serving, request)
        if isinstance(exc, DependencyUnavailableError):
            raise _did_not_run(serving, request, exc) from exc
        raise
    serving.mark_enqueued_soon(request_id)
    serving.depths.added(queue)


async def _answer_here(serving: Serving, request: AdmitRequest) -> Answered:
    """A small-talk request, answered by this front door with no queue and no worker
    (`answering.canned_answer`) and recorded with its answer in one write: a greeting does not
    wait behind the tier's LLM work, takes no fair-share slot, and a crash leaves the whole
    record or none (the client's resend then runs it anew)."""
    result = await serving.io(_answer_here_blocking, serving, request)
    total_ms = 1000 * (time.perf_counter() - request.started)
    return Answered(request.request_id, request.decision, result, total_ms, False,
                    conversation_id=request.conversation_id or request.request_id)


def _answer_here_blocking(serving: Serving, request: AdmitRequest) -> AnswerResult:
    progress, request_id = request.progress, request.request_id
    task = AnswerTask(request_id=request_id, tenant=request.tenant, query=request.searched_query,
                      tier=request.tier, strategy=request.decision.strategy, enqueued_at=time.time())
    with progress.stage("answer_here"):
        result = canned_answer(task)
    with progress.stage("record"):
        serving.records.record_answered(
            request_id, request.tenant, request.client_request_id, request.query, request.decision,
            result, FRONT_DOOR, conversation_id=request.conversation_id,
            standalone_query=request.standalone_query,
            rewrite=request.rewrite.method.value if request.standalone_query and request.rewrite else None)
    serving.on_recorded(request_id)
    serving.routed(request.decision)
    return result


def _reject(serving: Serving, request: AdmitRequest) -> None:
    """Mark a refused request `rejected` (a resend admits it again) and count it (blocking)."""
    serving.records.set_status(request.request_id, RequestStatus.REJECTED)
    serving.on_rejected(request.tier)


def _did_not_run(serving: Serving, request: AdmitRequest, cause: Exception) -> DependencyUnavailableError:
    """Mark a request that could not be queued as never run (a resend with its
    client_request_id admits it again) and say so to the caller (blocking)."""
    try:
        serving.records.set_status(request.request_id, RequestStatus.REJECTED)
    except Exception as exc:  # noqa: BLE001 - the records may be down too; the resend fixes it
        LOG.warning("mark_not_run_failed", error=str(exc))
    return DependencyUnavailableError(
        f"{cause}; request {request.request_id} did not run: send it again (with the same "
        "client_request_id to keep this request id)")


async def _answer_when_done(serving: Serving, request: AdmitRequest) -> Answered:
    """The queued request's answer within the deadline (and a sampled shadow run). The
    tenant's slot is given back once the work ended, without holding up the reply."""
    try:
        if request.decision.strategy != SMALL_TALK:  # nothing to learn from a greeting
            await _maybe_shadow(serving, request)
        with request.progress.stage("wait"):
            result = await _wait(serving, request)
        # What the queue made this task wait, as it happened (a replay's or a GetResult's
        # old result would tell about the past).
        serving.delay_gate.observe(request.tier, result.timings.queue_wait_ms / 1000.0)
    except AnswerFailedError:  # the worker finished, with an error
        release_soon(serving, request)
        raise
    except BaseException:  # the deadline passed or the client left: the work goes on
        release_when_done(serving, request)
        raise
    release_soon(serving, request)
    total_ms = 1000 * (time.perf_counter() - request.started)
    return Answered(request.request_id, request.decision, result, total_ms, False,
                    conversation_id=request.conversation_id or request.request_id,
                    rewritten_query=request.standalone_query or "",
                    rewrite=request.rewrite.method.value if request.standalone_query and request.rewrite else "")


async def _maybe_shadow(serving: Serving, request: AdmitRequest) -> None:
    share = serving.config.shadow_share
    if share <= 0.0 or serving.sample() >= share:
        return
    shadow = SHADOW_TIER[request.tier]
    task = AnswerTask(request_id=request.request_id, tenant=request.tenant, query=request.searched_query,
                      tier=shadow, strategy=serving.config.strategy_for(shadow),
                      kind=ResultKind.SHADOW, enqueued_at=time.time())
    try:
        await serving.io(serving.queue.enqueue, task)
        LOG.info("shadow_enqueued", shadow_tier=shadow.value, strategy=task.strategy)
    except Exception as exc:  # noqa: BLE001 - a shadow run is optional; the answer is not
        LOG.warning("shadow_enqueue_failed", shadow_tier=shadow.value, error=str(exc))


async def _wait(serving: Serving, request: AdmitRequest) -> AnswerResult:
    """The primary run's result within the deadline (its task id is the request id)."""
    request_id = request.request_id
    budget = request.deadline - time.monotonic()
    if budget <= 0:
        raise _timeout(request_id, 0.0)
    try:
        result = await serving.waiter.wait(task_id_for(request_id), budget)
    except TimeoutError:
        raise _timeout(request_id, budget) from None
    return answer_or_raise(request_id, result)


def _timeout(request_id: str, budget: float) -> AnswerTimeoutError:
    waited = f" within {budget:.2f} s" if budget else ""
    return AnswerTimeoutError(
        f"no answer{waited}; request {request_id} keeps running: GetResult(request_id=\"{request_id}\")",
        request_id,
    )


async def _replay(serving: Serving, request: AdmitRequest, existing: RequestView) -> Answered:
    """A repeated client_request_id: the stored reply, or wait for the run in progress.

    A request that never ran (rejected because its queue was full, or the front door stopped
    before routing it) is admitted now under its original request id.
    """
    # The first call's conversation and rewrite hold (what it recorded is what runs).
    rewrite = (Rewrite(existing.standalone_query, RewriteMethod(existing.rewrite or RewriteMethod.RULES))
               if existing.standalone_query else None)
    request = replace(request, request_id=existing.request_id, rewrite=rewrite,
                      conversation_id=existing.conversation_id)
    request_id = request.request_id
    request.progress.bind(request_id=request_id, replay=True)
    if existing.query != request.query:
        raise ClientRequestIdReusedError(
            f"client_request_id {existing.client_request_id!r} was already used for a "
            f"different query (request {request_id})"
        )
    recorded = await serving.io(serving.records.decision_for, request_id)
    if recorded is None:  # recorded by a front door that stopped before routing it: this call's decision
        with request.progress.stage("record"):
            await serving.io(serving.records.record_decision, request_id, request.decision)
        serving.routed(request.decision)
        await serving.io(serving.records.set_status, request_id, RequestStatus.QUEUED)
        return await _admit(serving, request)
    request = replace(request, decision=recorded)
    request.progress.tier = request.tier
    if existing.status is RequestStatus.QUEUED:
        await _publish_if_stranded(serving, request_id)
    if existing.status in NEVER_RAN or await _failed_for_a_dependency(serving, existing):
        if await _readmit(serving, request_id):
            return await _admit(serving, request)
        # Another front door admitted it again at the same moment: follow that run.
        existing = await serving.io(serving.records.get_request, request_id) or existing
    if existing.status in FINISHED:
        result = await stored_result(serving, request_id)
    else:
        result = await _wait(serving, request)
        await release(serving, request)
    return Answered.stored(request_id, request.decision, result, existing)


async def _publish_if_stranded(serving: Serving, request_id: str) -> None:
    """Publish the task of a queued request that was never marked published (its front door
    died between the record and the enqueue), unless a relay holds it or it is too young."""
    published = await serving.io(serving.records.publish_unpublished, serving.queue.enqueue,
                                 RESEND_PUBLISH_AFTER_S, request_id)
    if published:
        LOG.warning("resend_published", reason="never published")


async def _failed_for_a_dependency(serving: Serving, existing: RequestView) -> bool:
    """Whether the request's run ended with an error that may pass (a resend runs it again)."""
    if existing.status is not RequestStatus.ERROR:
        return False
    stored = await serving.io(serving.records.get_result, existing.request_id)
    return stored is not None and stored.error_code in RETRYABLE_ERRORS


async def _readmit(serving: Serving, request_id: str) -> bool:
    """Queue the request again (False: it may not run again, or another front door did it).

    The queue's stored result of an earlier run goes first: the new run has the same task id,
    and its waiters must not be answered by the old error. The records then delete that
    run's error row in the transaction that queues the request again.
    """
    await serving.io(serving.queue.forget, task_id_for(request_id))
    readmitted = await serving.io(serving.records.readmit, request_id)
    if readmitted:
        LOG.info("readmitted")
    return readmitted
