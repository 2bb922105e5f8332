"""The serving use cases with no gRPC and no Celery: admission (`AnswerService`) over in-memory
ports, and a worker's `answer_task` over fake strategies' ports."""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages
from frontdoor_fakes import FakeQueue, FakeRouter, FakeStore, FakeWaiter, default_work

from adaptive_rag.contracts import (
    AnswerResult, AnswerStyle, AnswerTask, ErrorCode, RequestStatus, ResultKind, Scope, Tier, Timings,
)
from adaptive_rag.errors import (
    DatabaseUnavailableError, DependencyUnavailableError, KnowledgeBaseMissingError, OverShareError, PermissionDeniedError,
    AnswerFailedError, AnswerTimeoutError, ClientRequestIdReusedError, IndexNotFoundError,
    InvalidQueryError, QueueFullError, RequestNotFinishedError, RequestNotFoundError,
    UnauthenticatedError,
)
from adaptive_rag.serving.commands import Answer, GetResult, Route, SubmitFeedback
from adaptive_rag.serving.context import AdmissionConfig, CallProgress
from adaptive_rag.serving.service import AnswerService
from adaptive_rag.serving.answering import Delivery, NotRunnable, RetryLater, answer_task
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import Abstention

KEY = "arag_key"
STRATEGY = {Tier.A: "no_retrieval", Tier.B: "single_step", Tier.C: "decompose"}


def service(delay_s: float = 0.0, work=None, shadow_share: float = 0.0, sample: float = 0.0,
            limits: dict | None = None, queued_expiry_s: float | None = None,
            queue: FakeQueue | None = None, wait_targets: dict | None = None,
            ) -> tuple[AnswerService, FakeStore, FakeQueue, list]:
    store = queue.store if queue is not None else FakeStore()
    store.add_key(KEY, "acme")
    queue = queue or FakeQueue(store, work=work, delay_s=delay_s)
    routed: list = []
    config = AdmissionConfig(max_query_chars=100, strategy_for=STRATEGY.__getitem__,
                             max_queue_depth=limits or {Tier.A: 5, Tier.B: 5, Tier.C: 2},
                             shadow_share=shadow_share, queued_expiry_s=queued_expiry_s,
                             queue_wait_target_s=wait_targets or {})
    svc = AnswerService(store, queue, FakeWaiter(queue), FakeRouter({"What is 2+2?": "A", "compare": "C"}),
                        config, has_knowledge_base=lambda tenant: tenant == "acme",
                        sample=lambda: sample, on_routed=routed.append,
                        on_expired=lambda count: routed.append(("expired", count)))
    return svc, store, queue, routed


def run(coro):
    return asyncio.run(coro)


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def eventually(check, within_s: float = 2.0) -> None:
    """Wait for `check()` (a slot is given back after the reply, on an I/O thread)."""
    end = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < end, f"not true within {within_s} s"
        time.sleep(0.005)


def test_answer_records_routes_enqueues_and_returns_the_workers_result():
    svc, store, queue, routed = service()
    progress = CallProgress()
    answered = run(svc.answer(Answer(KEY, b"compare", None, soon()), progress))
    [task] = queue.tasks
    assert (task.tier, task.strategy, task.kind, task.query) == (Tier.C, "decompose", ResultKind.PRIMARY, "compare")
    assert answered.request_id == task.request_id == progress.request_id and progress.tier is Tier.C
    assert answered.result.answer == "answer to compare" and not answered.replayed
    decision = store.decisions[answered.request_id]
    assert decision == answered.decision and routed == [decision]
    assert decision.strategy == "decompose" and decision.classify_ms > 0
    assert store.requests[answered.request_id].status is RequestStatus.DONE
    # Where the time went, stage by stage (the front door exports them as a histogram).
    assert set(progress.stages) == {"authenticate", "validate", "knowledge", "classify", "record",
                                    "admit", "enqueue", "wait"}
    assert all(ms >= 0 for ms in progress.stages.values())
    assert sum(progress.stages.values()) <= answered.total_ms + 1e-6


def test_the_request_is_refused_before_anything_is_recorded():
    svc, store, queue, _ = service()
    with pytest.raises(UnauthenticatedError):
        run(svc.answer(Answer("arag_wrong", b"What is 2+2?", None, soon()), CallProgress()))
    with pytest.raises(InvalidQueryError, match="not valid UTF-8"):
        run(svc.answer(Answer(KEY, b"\xff", None, soon()), CallProgress()))
    assert store.requests == {} and queue.tasks == []


def test_a_full_queue_rejects_and_a_resend_runs_under_the_same_request_id():
    svc, store, queue, _ = service()
    queue.depths["tier-c"] = 2
    progress = CallProgress()
    with pytest.raises(QueueFullError, match="limit 2"):
        run(svc.answer(Answer(KEY, b"compare", "order-7", soon()), progress))
    assert store.requests[progress.request_id].status is RequestStatus.REJECTED and queue.tasks == []
    with pytest.raises(RequestNotFinishedError, match="never ran"):
        run(svc.get_result(GetResult(KEY, progress.request_id), CallProgress()))
    queue.depths["tier-c"] = 0
    answered = run(svc.answer(Answer(KEY, b"compare", "order-7", soon()), CallProgress()))
    assert answered.request_id == progress.request_id and not answered.replayed


def test_a_standing_queue_sheds_by_its_wait_budget_before_its_length_limit():
    def slow_queue(task):  # the workers report how long each task waited in its queue
        return default_work(task).model_copy(update={"timings": Timings(queue_wait_ms=4000.0, strategy_ms=1.0)})

    svc, store, queue, _ = service(work=slow_queue, wait_targets={Tier.A: 1.0})
    for _ in range(3):  # three A answers, each after 4 s in the queue (its target: 1 s)
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    assert svc.delay_gate.standing(Tier.A) is not None
    run(svc.answer(Answer(KEY, b"compare", None, soon()), CallProgress()))  # tier C has no wait budget
    queue.depths["tier-a"] = 3  # far below its length limit of 5
    progress = CallProgress()
    with pytest.raises(QueueFullError, match=r"stands: even the shortest wait of its last 3 .* 4.00 s \(target 1 s\)"):
        run(svc.answer(Answer(KEY, b"What is 2+2?", "k-9", soon()), progress))
    assert store.requests[progress.request_id].status is RequestStatus.REJECTED
    assert len(queue.tasks) == 4  # nothing more was queued
    queue.depths["tier-a"] = 0  # the queue drained: the gate has nothing to hold back
    again = run(svc.answer(Answer(KEY, b"What is 2+2?", "k-9", soon()), CallProgress()))
    assert again.request_id == progress.request_id and again.result.answer == "answer to What is 2+2?"


def test_a_replayed_request_is_the_stored_reply_built_from_the_same_types():
    svc, _, queue, _ = service()
    live = run(svc.answer(Answer(KEY, b"What is 2+2?", "k1", soon()), CallProgress()))
    replay = run(svc.answer(Answer(KEY, b"What is 2+2?", "k1", soon()), CallProgress()))
    stored = run(svc.get_result(GetResult(KEY, live.request_id), CallProgress()))
    assert replay.replayed and stored.replayed and len(queue.tasks) == 1
    assert replay.result == stored.result == live.result and replay.decision == live.decision
    assert stored.total_ms == pytest.approx(
        live.decision.classify_ms + live.result.timings.queue_wait_ms + live.result.timings.strategy_ms)
    with pytest.raises(ClientRequestIdReusedError):
        run(svc.answer(Answer(KEY, b"another question", "k1", soon()), CallProgress()))


def test_the_record_insert_is_the_idempotency_check_and_a_replay_counts_no_decision():
    svc, store, queue, routed = service()
    asked: list[tuple] = []
    find = store.find_request
    store.find_request = lambda *args: asked.append(args) or find(*args)
    live = run(svc.answer(Answer(KEY, b"compare", "k2", soon()), CallProgress()))
    assert asked == []  # a new request: no read before its insert
    progress = CallProgress()
    replay = run(svc.answer(Answer(KEY, b"compare", "k2", soon()), progress))
    assert asked == [("acme", "k2")] and replay.replayed and replay.request_id == live.request_id
    assert routed == [live.decision] and len(store.requests) == 1 and len(queue.tasks) == 1
    assert progress.request_id == live.request_id and "idempotency" in progress.stages


def test_no_result_within_the_deadline_names_the_request_that_keeps_running():
    svc, store, _, _ = service(delay_s=0.5)
    progress = CallProgress()
    with pytest.raises(AnswerTimeoutError) as info:
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon(0.1)), progress))
    assert info.value.request_id == progress.request_id
    with pytest.raises(RequestNotFinishedError, match="still queued"):
        run(svc.get_result(GetResult(KEY, progress.request_id), CallProgress()))
    time.sleep(0.6)
    assert run(svc.get_result(GetResult(KEY, progress.request_id), CallProgress())).result.answer == "answer to What is 2+2?"


def test_a_recorded_worker_error_is_raised_with_its_code():
    def fail(task: AnswerTask) -> AnswerResult:
        return AnswerResult(request_id=task.request_id, tier=task.tier, strategy=task.strategy,
                            error="LLMUnavailableError: refused", error_code=ErrorCode.DEPENDENCY_UNAVAILABLE)

    svc, *_ = service(work=fail)
    with pytest.raises(AnswerFailedError) as info:
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    assert info.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE and "refused" in str(info.value)


def test_shadow_runs_are_sampled_onto_the_neighbouring_tier():
    svc, _, queue, _ = service(shadow_share=0.5, sample=0.1)
    run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    shadow = [t for t in queue.tasks if t.kind is ResultKind.SHADOW]
    assert [(t.tier, t.strategy) for t in shadow] == [(Tier.B, "single_step")]
    svc, _, queue, _ = service(shadow_share=0.5, sample=0.9)
    run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    assert all(t.kind is ResultKind.PRIMARY for t in queue.tasks)


def test_other_tenants_requests_are_not_found():
    svc, store, _, _ = service()
    store.add_key("arag_other", "globex")
    answered = run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    with pytest.raises(RequestNotFoundError):
        run(svc.get_result(GetResult("arag_other", answered.request_id), CallProgress()))
    with pytest.raises(RequestNotFoundError):
        run(svc.submit_feedback(SubmitFeedback("arag_other", answered.request_id, 1, None, None), CallProgress()))
    assert run(svc.submit_feedback(SubmitFeedback(KEY, answered.request_id, 1, None, None), CallProgress())) == 1


# --- the worker's use case -------------------------------------------------------------------------


class Resources:
    def __init__(self, retriever) -> None:
        self.settings = Settings(_env_file=None, top_k=2)
        self._retriever = retriever
        self._llm = FakeLLM(lambda prompt: "Lumora Lighting")
        self.tenants: list[str] = []

    def retriever(self, tenant: str):
        self.tenants.append(tenant)
        if isinstance(self._retriever, Exception):
            raise self._retriever
        return self._retriever

    def abstention(self, tenant: str) -> Abstention:
        return Abstention()

    def answer_style(self, tenant: str) -> AnswerStyle:
        return AnswerStyle.SHORT

    def llm(self):
        return self._llm


def recorded_task(store: FakeStore, tier: Tier = Tier.B) -> AnswerTask:
    store.create_request("r1", "acme", None, "Who makes Lumora lamps?")
    return AnswerTask(request_id="r1", tenant="acme", query="Who makes Lumora lamps?", tier=tier,
                      strategy=STRATEGY[tier], enqueued_at=time.time() - 0.05)


def test_answer_task_runs_the_strategy_and_writes_the_result_once():
    store = FakeStore()
    task = recorded_task(store)
    resources = Resources(FakeRetriever(make_passages(4)))
    result = answer_task(task, store, resources, Delivery("tier-b@h/1", 1, may_retry=True))
    assert result.ok and result.steps == 1 and len(result.sources) == 2
    assert resources.tenants == ["acme"]  # retrieval is scoped to the task's tenant
    assert result.timings.queue_wait_ms >= 50 and result.timings.strategy_ms >= 0
    assert store.requests["r1"].status is RequestStatus.DONE
    assert (RequestStatus.RUNNING in [s for _, s in store.statuses])
    again = answer_task(task, store, resources, Delivery("tier-b@h/2", 2, may_retry=True))
    assert again == result and len(store.results) == 1  # a second delivery returns the first


def test_a_first_primary_delivery_claims_its_run_without_reading_results_first():
    store = FakeStore()
    task = recorded_task(store)
    reads: list[tuple] = []
    get_result = store.get_result
    store.get_result = lambda *args: reads.append(args) or get_result(*args)
    resources = Resources(FakeRetriever(make_passages(4)))
    result = answer_task(task, store, resources, Delivery("tier-b@h/1", 1, may_retry=True))
    assert result.ok and reads == []
    again = answer_task(task, store, resources, Delivery("tier-b@h/2", 2, may_retry=True))
    assert again == result and len(reads) == 1  # finished: begin_run refuses, the result is read


def test_transient_failures_retry_while_allowed_then_are_recorded():
    store = FakeStore()
    task = recorded_task(store)
    missing = Resources(IndexNotFoundError("no tantivy index in /x"))
    with pytest.raises(RetryLater, match="IndexNotFoundError"):
        answer_task(task, store, missing, Delivery("w", 1, may_retry=True))
    assert store.results == {}
    result = answer_task(task, store, missing, Delivery("w", 4, may_retry=False))
    assert result.error_code is ErrorCode.DEPENDENCY_UNAVAILABLE and "no tantivy index" in result.error
    assert store.requests["r1"].status is RequestStatus.ERROR


def test_a_time_limit_and_a_bug_are_recorded_with_their_codes():
    class Stop(Exception):
        pass

    store = FakeStore()
    task = recorded_task(store)
    result = answer_task(task, store, Resources(Stop("soft limit")), Delivery("w", 1, True),
                         time_limit_errors=(Stop,))
    assert result.error_code is ErrorCode.TIME_LIMIT
    assert "did not finish within its time limit" in result.error and "Stop" not in result.error
    store2 = FakeStore()
    task2 = recorded_task(store2)
    bug = answer_task(task2, store2, Resources(KeyError("oops")), Delivery("w", 1, True))
    assert bug.error_code is ErrorCode.INTERNAL and "KeyError" in bug.error


def test_route_records_a_decision_and_runs_nothing():
    svc, store, queue, routed = service()
    progress = CallProgress()
    decided = run(svc.route(Route(KEY, b"compare"), progress))
    assert decided.decision.tier is Tier.C and decided.decision.strategy == "decompose"
    assert decided.decision_id == progress.request_id and progress.tier is Tier.C
    assert queue.tasks == [] and routed == [decided.decision]
    assert store.requests[decided.decision_id].status is RequestStatus.ROUTED
    assert store.decisions[decided.decision_id] == decided.decision
    with pytest.raises(RequestNotFinishedError, match="routing decision only"):
        run(svc.get_result(GetResult(KEY, decided.decision_id), CallProgress()))
    # The client ran the strategy itself and says how it went: feedback on the decision.
    assert run(svc.submit_feedback(SubmitFeedback(KEY, decided.decision_id, 1, None, None), CallProgress())) == 1
    with pytest.raises(InvalidQueryError):
        run(svc.route(Route(KEY, b""), CallProgress()))


def test_known_keys_are_remembered_for_their_time_to_live_only():
    from adaptive_rag.serving.context import TtlCache

    now = [0.0]
    keys = TtlCache(ttl_s=30.0, max_items=2, clock=lambda: now[0])
    keys.put("k1", "acme")
    assert keys.get("k1") == "acme" and keys.get("unknown") is None
    now[0] = 30.0
    assert keys.get("k1") is None  # expired: the records are asked again (a revocation shows)
    keys.put("k1", "acme"), keys.put("k2", "globex"), keys.put("k3", "initech")
    assert keys.get("k1") is None and keys.get("k3") == "initech"  # bounded, oldest out
    assert TtlCache(ttl_s=0).get("k1") is None


def test_with_a_key_cache_the_records_are_asked_once_per_key():
    svc, store, _, _ = service()
    svc._keys.ttl_s = 60.0
    asked = []
    original = store.principal_for_key
    store.principal_for_key = lambda key: asked.append(key) or original(key)
    for _ in range(3):
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    with pytest.raises(UnauthenticatedError):
        run(svc.answer(Answer("arag_unknown", b"What is 2+2?", None, soon()), CallProgress()))
    with pytest.raises(UnauthenticatedError):
        run(svc.answer(Answer("arag_unknown", b"What is 2+2?", None, soon()), CallProgress()))
    assert asked == [KEY, "arag_unknown", "arag_unknown"]  # unknown keys are never cached


def test_a_cleared_cache_drops_a_value_looked_up_before_the_clear():
    from adaptive_rag.serving.context import TtlCache

    keys = TtlCache(ttl_s=30.0)
    keys.put("k1", "acme")
    looked_up_at = keys.generation  # a look-up of k2 starts
    keys.clear()  # a revocation is seen meanwhile
    keys.put("k2", "acme", looked_up_at)  # the look-up ends: its answer may predate the revocation
    assert keys.get("k1") is None and keys.get("k2") is None
    keys.put("k2", "acme", keys.generation)
    assert keys.get("k2") == "acme"


def test_a_revoked_key_is_dropped_from_the_cache_when_the_key_tables_revision_changes():
    svc, store, _, _ = service()
    svc._keys.ttl_s = 600.0
    assert run(svc.drop_revoked_keys())  # the first look: nothing cached is trusted
    run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))  # cached now
    store.revoke_key(KEY)
    assert run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress())).result.answer
    assert run(svc.drop_revoked_keys())  # the mark: the table changed
    with pytest.raises(UnauthenticatedError):
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    assert not run(svc.drop_revoked_keys())  # no change since: the cache is kept


def test_a_look_up_racing_a_revocation_cannot_put_the_revoked_key_back():
    svc, store, _, _ = service()
    svc._keys.ttl_s = 600.0
    original = store.principal_for_key

    def principal_then_revoked(key):
        principal = original(key)  # read while the key was valid ...
        store.revoke_key(KEY)  # ... revoked before the front door caches it,
        assert run(svc.drop_revoked_keys())  # and the watch sees the revocation at once
        store.principal_for_key = original
        return principal

    run(svc.drop_revoked_keys())
    store.principal_for_key = principal_then_revoked
    run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))  # in flight: answered
    with pytest.raises(UnauthenticatedError):  # not served from the cache afterwards
        run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))


# --- scopes, knowledge bases, fair share --------------------------------------------------------------


def test_each_call_needs_its_scope_and_the_tenant_comes_from_the_key():
    svc, store, queue, _ = service()
    store.add_key("arag_feedback_only", "acme", frozenset({Scope.FEEDBACK}))
    store.add_key("arag_writer", "acme", frozenset({Scope.KB_WRITE}))
    for key in ("arag_feedback_only", "arag_writer"):
        with pytest.raises(PermissionDeniedError, match="may not 'answer'"):
            run(svc.answer(Answer(key, b"What is 2+2?", None, soon()), CallProgress()))
        with pytest.raises(PermissionDeniedError):
            run(svc.route(Route(key, b"What is 2+2?"), CallProgress()))
    answered = run(svc.answer(Answer(KEY, b"What is 2+2?", None, soon()), CallProgress()))
    assert queue.tasks[-1].tenant == "acme"
    with pytest.raises(PermissionDeniedError, match="may not 'feedback'"):
        run(svc.submit_feedback(SubmitFeedback("arag_writer", answered.request_id, 1, None, None), CallProgress()))
    assert run(svc.submit_feedback(SubmitFeedback("arag_feedback_only", answered.request_id, 1, None, None), CallProgress())) == 1


def test_a_tenant_without_a_knowledge_base_is_refused_before_anything_is_recorded():
    svc, store, queue, _ = service()
    store.add_key("arag_newcomer", "initech")
    with pytest.raises(KnowledgeBaseMissingError, match="'initech' has no knowledge base"):
        run(svc.answer(Answer("arag_newcomer", b"What is 2+2?", None, soon()), CallProgress()))
    assert store.requests == {} and queue.tasks == []


class CountingFairShare:
    """Admits `allowed` requests per tenant at once; records acquires and releases."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.held: dict[str, set[str]] = {}
        self.released: list[str] = []

    def acquire(self, tenant, tier, request_id):
        held = self.held.setdefault(tenant, set())
        if request_id not in held and len(held) >= self.allowed:
            raise OverShareError(f"tenant over its share of tier {tier.value}", retry_after_s=2.5)
        held.add(request_id)

    def release(self, tenant, tier, request_id):
        self.held.get(tenant, set()).discard(request_id)
        self.released.append(request_id)


def test_a_tenant_over_its_share_is_rejected_and_a_finished_answer_gives_its_slot_back():
    svc, store, queue, _ = service()
    share = svc.fair_share = CountingFairShare(allowed=1)
    first = run(svc.answer(Answer(KEY, b"What is 2+2?", "c-1", soon()), CallProgress()))
    eventually(lambda: share.released == [first.request_id] and share.held["acme"] == set())
    share.held["acme"] = {"someone-else"}  # the tenant's one slot is taken
    with pytest.raises(OverShareError) as refused:
        run(svc.answer(Answer(KEY, b"compare", "c-2", soon()), CallProgress()))
    assert refused.value.retry_after_s == 2.5
    rejected = store.find_request("acme", "c-2")
    assert rejected.status is RequestStatus.REJECTED and len(queue.tasks) == 1  # nothing ran
    share.held["acme"] = set()
    again = run(svc.answer(Answer(KEY, b"compare", "c-2", soon()), CallProgress()))  # the resend runs
    assert again.request_id == rejected.request_id and again.result.answer == "answer to compare"


def test_small_talk_is_answered_at_admission_without_the_classifier_a_queue_or_a_shadow_run():
    svc, store, queue, routed = service(shadow_share=1.0)
    asked = []
    original = svc.router.route
    svc.router.route = lambda query, tenant=None: asked.append(query) or original(query, tenant)
    answered = run(svc.answer(Answer(KEY, "Thanks a lot!".encode(), "c-thanks", soon()), CallProgress()))
    assert queue.tasks == [] and asked == []  # nothing queued, no shadow run, no classifier
    assert (answered.result.tier, answered.result.strategy) == (Tier.A, "small_talk")
    assert answered.result.answerable and answered.result.answer and not answered.replayed
    decision = store.decisions[answered.request_id]
    assert decision.model_name == "small_talk" and decision.reason == "small talk (thanks)"
    # Recorded as a worker's run would be: finished, its one result row, a resend replays it.
    assert store.get_request(answered.request_id).status is RequestStatus.DONE
    assert store.get_result(answered.request_id).answer == answered.result.answer
    again = run(svc.answer(Answer(KEY, "Thanks a lot!".encode(), "c-thanks", soon()), CallProgress()))
    assert again.replayed and again.request_id == answered.request_id and queue.tasks == []
    run(svc.answer(Answer(KEY, b"hi, how do I reset my hub?", None, soon()), CallProgress()))
    assert asked == ["hi, how do I reset my hub?"]  # a question that starts with a greeting is queued
    assert [t.kind for t in queue.tasks] == [ResultKind.PRIMARY, ResultKind.SHADOW]


def test_a_query_asking_two_questions_goes_to_c_whatever_the_router_says():
    svc, store, queue, _routed = service()
    two = "Which plan is required for the Lumora Developer API, and what is its rate limit?"
    answered = run(svc.answer(Answer(KEY, two.encode(), None, soon()), CallProgress()))
    decision = store.decisions[answered.request_id]
    assert decision.tier is Tier.C and decision.reason.endswith("; several questions in one: C")
    assert queue.tasks[-1].tier is Tier.C and queue.tasks[-1].strategy == svc.config.strategy_for(Tier.C)
    one = run(svc.answer(Answer(KEY, b"What is the rate limit of the Lumora Developer API?", None, soon()), CallProgress()))
    assert store.decisions[one.request_id].tier is Tier.B  # the fake router's B stands


def test_the_small_talk_strategy_replies_briefly_without_retrieval_or_llm():
    from adaptive_rag.strategies import build_strategy, uses_retrieval

    strategy = build_strategy("small_talk", None, None, Settings(_env_file=None))
    result = strategy.run("Are you a bot?")
    assert result.answer.startswith("I'm a virtual assistant") and result.steps == 0
    assert not uses_retrieval("small_talk") and uses_retrieval("single_step")


def test_a_slot_is_held_while_the_work_runs_even_after_the_caller_stopped_waiting():
    svc, store, queue, _ = service(delay_s=0.4)
    share = svc.fair_share = CountingFairShare(allowed=1)

    async def scenario() -> None:
        with pytest.raises(AnswerTimeoutError):  # the deadline passes; the work goes on
            await svc.answer(Answer(KEY, b"compare", None, soon(0.1)), CallProgress())
        [held] = share.held["acme"]
        with pytest.raises(OverShareError):  # still the tenant's one slot
            await svc.answer(Answer(KEY, b"compare", None, soon()), CallProgress())
        await asyncio.sleep(0.6)  # the work finished: its slot came back
        assert share.held["acme"] == set() and share.released[0] == held
        cancelled = asyncio.create_task(svc.answer(Answer(KEY, b"compare", None, soon()), CallProgress()))
        await asyncio.sleep(0.1)
        cancelled.cancel()  # the client left; its task is queued and runs
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert len(share.held["acme"]) == 1  # not given back while the work runs
        await asyncio.sleep(0.6)
        assert share.held["acme"] == set()

    run(scenario())


def test_a_request_the_queue_could_not_take_is_never_lost_and_runs_when_resent():
    svc, store, queue, _ = service()
    queue.down = DependencyUnavailableError("the task queue is unreachable (enqueue: ConnectionError)")
    with pytest.raises(DependencyUnavailableError, match="did not run: send it again") as info:
        run(svc.answer(Answer(KEY, b"compare", "c-9", soon()), CallProgress()))
    stored = store.find_request("acme", "c-9")
    assert stored.status is RequestStatus.REJECTED and stored.request_id in str(info.value)
    queue.down = None  # the broker is back: the resend runs under the same request id
    again = run(svc.answer(Answer(KEY, b"compare", "c-9", soon()), CallProgress()))
    assert again.request_id == stored.request_id and again.result.answer == "answer to compare"


def test_a_records_database_that_does_not_answer_is_unavailable_not_a_bug():
    """The records adapter says so in the library's words (`test_records`: a real engine's)."""
    svc, store, _, _ = service()

    def down(*_args):
        raise DatabaseUnavailableError("the records database is unreachable (OperationalError)")

    store.principal_for_key = down
    with pytest.raises(DependencyUnavailableError, match="records database is unreachable"):
        run(svc.answer(Answer(KEY, b"compare", None, soon()), CallProgress()))


def test_a_resent_request_recorded_without_a_decision_is_routed_and_run_under_its_id():
    """A front door that stopped between recording a request and routing it left no decision:
    the resend records its own decision and runs the request."""
    svc, store, queue, routed = service()
    store.create_request("r-old", "acme", "c-old", "compare", RequestStatus.QUEUED)
    progress = CallProgress()
    answered = run(svc.answer(Answer(KEY, b"compare", "c-old", soon()), progress))
    assert answered.request_id == progress.request_id == "r-old" and not answered.replayed
    assert store.decisions["r-old"] == answered.decision == routed[0] and answered.decision.tier is Tier.C
    assert [t.request_id for t in queue.tasks] == ["r-old"]
    assert answered.result.answer == "answer to compare"


# --- no request left queued forever; a resend runs ----------------------------------------------------


class LosingQueue(FakeQueue):
    """A broker that loses the first message it takes (the others run as usual)."""

    def __init__(self, store: FakeStore) -> None:
        super().__init__(store)
        self.lost: list[AnswerTask] = []

    def enqueue(self, task: AnswerTask) -> None:
        if not self.lost:
            self.lost.append(task)
            return
        super().enqueue(task)


def test_a_request_whose_message_was_lost_expires_and_its_resend_runs_under_the_same_id():
    svc, store, queue, seen = service(queued_expiry_s=0.2, queue=LosingQueue(FakeStore()))
    progress = CallProgress()
    with pytest.raises(AnswerTimeoutError):
        run(svc.answer(Answer(KEY, b"compare", "order-1", soon(0.1)), progress))
    request_id = progress.request_id
    with pytest.raises(RequestNotFinishedError, match="still queued; call GetResult again later"):
        run(svc.get_result(GetResult(KEY, request_id), CallProgress()))
    assert run(svc.expire_stale()) == []  # not old enough yet
    time.sleep(0.25)
    assert run(svc.expire_stale()) == [request_id] and seen[-1] == ("expired", 1)  # counted
    assert store.requests[request_id].status is RequestStatus.EXPIRED
    with pytest.raises(RequestNotFinishedError,
                       match=f"request {request_id} was expired and never ran; send the Answer again"):
        run(svc.get_result(GetResult(KEY, request_id), CallProgress()))
    answered = run(svc.answer(Answer(KEY, b"compare", "order-1", soon()), CallProgress()))
    assert answered.request_id == request_id and not answered.replayed
    assert answered.result.answer == "answer to compare"
    assert [t.request_id for t in [*queue.lost, *queue.tasks]] == [request_id, request_id]
    assert queue.forgotten == [request_id] and run(svc.expire_stale()) == []


def test_expiry_is_off_without_an_age_and_skipped_while_another_front_door_sweeps():
    svc, store, _, seen = service(delay_s=5.0)
    with pytest.raises(AnswerTimeoutError):
        run(svc.answer(Answer(KEY, b"compare", None, soon(0.05)), CallProgress()))
    assert run(svc.expire_stale()) == []
    svc, store, _, seen = service(queued_expiry_s=0.01, delay_s=5.0)
    with pytest.raises(AnswerTimeoutError):
        run(svc.answer(Answer(KEY, b"compare", None, soon(0.05)), CallProgress()))
    store.sweeping = True
    assert run(svc.expire_stale()) == [] and ("expired", 1) not in seen
    store.sweeping = False
    assert len(run(svc.expire_stale())) == 1 and seen[-1] == ("expired", 1)


def dependency_then(code: ErrorCode | None):
    """Work whose first run fails with `dependency_unavailable`, the next ones with `code` (None:
    answers)."""
    runs: list[str] = []

    def work(task: AnswerTask) -> AnswerResult:
        runs.append(task.request_id)
        failing = ErrorCode.DEPENDENCY_UNAVAILABLE if len(runs) == 1 else code
        if failing is None:
            return AnswerResult(request_id=task.request_id, tier=task.tier, strategy=task.strategy,
                                answer="answered after all")
        return AnswerResult(request_id=task.request_id, tier=task.tier, strategy=task.strategy,
                            error=f"failed ({failing.value})", error_code=failing)

    return work, runs


def test_a_resend_runs_a_request_that_failed_for_a_dependency_again():
    work, runs = dependency_then(None)
    svc, store, queue, _ = service(work=work)
    progress = CallProgress()
    with pytest.raises(AnswerFailedError, match="send the Answer again with the same client_request_id") as info:
        run(svc.answer(Answer(KEY, b"compare", "order-2", soon()), progress))
    assert info.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE
    with pytest.raises(AnswerFailedError):  # GetResult says the same
        run(svc.get_result(GetResult(KEY, progress.request_id), CallProgress()))
    again = run(svc.answer(Answer(KEY, b"compare", "order-2", soon()), CallProgress()))
    assert again.request_id == progress.request_id and again.result.answer == "answered after all"
    assert runs == [progress.request_id] * 2 and queue.forgotten == [progress.request_id]
    assert list(store.results) == [(progress.request_id, ResultKind.PRIMARY, Tier.C)]  # one row
    replay = run(svc.answer(Answer(KEY, b"compare", "order-2", soon()), CallProgress()))
    assert replay.replayed and replay.result == again.result and len(runs) == 2


@pytest.mark.parametrize("code", [ErrorCode.TIME_LIMIT, ErrorCode.INTERNAL])
def test_other_recorded_errors_are_final_and_a_resend_returns_them(code):
    work, runs = dependency_then(code)
    svc, store, queue, _ = service(work=work)
    with pytest.raises(AnswerFailedError):
        run(svc.answer(Answer(KEY, b"compare", "order-3", soon()), CallProgress()))
    with pytest.raises(AnswerFailedError) as info:  # the resend runs it again: now it is final
        run(svc.answer(Answer(KEY, b"compare", "order-3", soon()), CallProgress()))
    assert info.value.code is code
    with pytest.raises(AnswerFailedError) as info:
        run(svc.answer(Answer(KEY, b"compare", "order-3", soon()), CallProgress()))
    assert info.value.code is code and "send the Answer again" not in str(info.value)
    assert len(runs) == 2 and len(queue.tasks) == 2


# --- the worker: requests not in flight, and the redelivery cap ------------------------------------


def test_a_task_whose_request_expired_is_not_run_unless_its_client_resent_it():
    store = FakeStore()
    task = recorded_task(store)
    store.requests["r1"].status = RequestStatus.EXPIRED
    resources = Resources(FakeRetriever(make_passages(4)))
    with pytest.raises(NotRunnable, match="expired"):
        answer_task(task, store, resources, Delivery("w", 1, may_retry=True))
    assert resources.tenants == [] and resources._llm.calls == [] and store.results == {}
    assert store.requests["r1"].status is RequestStatus.EXPIRED and store.requests["r1"].deliveries == 0
    assert store.readmit("r1")  # the client resent it: the old message runs it now
    result = answer_task(task, store, resources, Delivery("w", 1, may_retry=True))
    assert result.ok and store.requests["r1"].status is RequestStatus.DONE
    again = answer_task(task, store, resources, Delivery("w", 1, may_retry=True))  # the resend's message
    assert again == result and len(store.results) == 1


def test_a_task_naming_another_tenants_request_neither_runs_nor_writes_to_it():
    store = FakeStore()
    recorded_task(store)  # acme's request r1
    forged = AnswerTask(request_id="r1", tenant="globex", query="Who makes Lumora lamps?", tier=Tier.B,
                        strategy=STRATEGY[Tier.B], enqueued_at=time.time())
    resources = Resources(FakeRetriever(make_passages(4)))
    with pytest.raises(NotRunnable, match="tenant globex: not recorded"):
        answer_task(forged, store, resources, Delivery("w", 1, may_retry=True))
    assert resources.tenants == [] and resources._llm.calls == [] and store.results == {}
    request = store.requests["r1"]
    assert (request.status, request.deliveries, request.runs) == (RequestStatus.QUEUED, 0, 0)


def test_every_run_begun_is_counted_though_the_request_has_one_result():
    store = FakeStore()
    task = recorded_task(store)
    resources = Resources(FakeRetriever(make_passages(4)))
    store.begin_run("r1", tenant="acme")  # a first delivery whose worker died mid-run
    result = answer_task(task, store, resources, Delivery("w", 2, may_retry=True))
    assert result.ok and len(store.results) == 1
    assert (store.requests["r1"].deliveries, store.requests["r1"].runs) == (2, 2)


def test_a_message_begun_more_often_than_the_cap_records_an_internal_error_without_running():
    store = FakeStore()
    task = recorded_task(store)
    store.begin_run("r1"), store.begin_run("r1")  # two deliveries died with their worker
    resources = Resources(FakeRetriever(make_passages(4)))
    result = answer_task(task, store, resources, Delivery("w", 3, may_retry=True), max_deliveries=2)
    assert result.error_code is ErrorCode.INTERNAL
    assert result.error == "the task killed its worker 2 times before it could finish; not run again"
    assert resources.tenants == [] and resources._llm.calls == []
    assert store.requests["r1"].status is RequestStatus.ERROR and store.requests["r1"].deliveries == 3
    assert answer_task(task, store, resources, Delivery("w", 4, True), max_deliveries=2) == result


def test_retries_are_new_messages_and_do_not_count_against_the_cap():
    store = FakeStore()
    task = recorded_task(store)
    for _ in range(3):  # three runs that asked for a retry (each one message, begun once)
        store.begin_run("r1")
    resources = Resources(FakeRetriever(make_passages(4)))
    result = answer_task(task, store, resources, Delivery("w", 4, may_retry=True, retries=3), max_deliveries=1)
    assert result.ok and store.requests["r1"].deliveries == 4


def test_a_shadow_run_is_capped_on_its_own_count():
    store = FakeStore()
    recorded_task(store)
    shadow = AnswerTask(request_id="r1", tenant="acme", query="Who makes Lumora lamps?", tier=Tier.C,
                        strategy="decompose", kind=ResultKind.SHADOW, enqueued_at=time.time())
    store.begin_run("r1", ResultKind.SHADOW)
    result = answer_task(shadow, store, Resources(FakeRetriever(make_passages(4))),
                         Delivery("w", 2, may_retry=True), max_deliveries=1)
    assert result.error_code is ErrorCode.INTERNAL and result.kind is ResultKind.SHADOW
    assert store.requests["r1"].status is RequestStatus.QUEUED  # the primary run is not touched
    assert store.requests["r1"].deliveries == 0 and store.requests["r1"].shadow_deliveries == 2


def test_the_default_cap_is_the_runs_a_task_may_lose_its_pool_process_in():
    from workers.settings import WorkerSettings

    assert WorkerSettings(_env_file=None, task_max_retries=4).max_deliveries == 5
    assert WorkerSettings(_env_file=None, task_max_retries=4, task_max_deliveries=2).max_deliveries == 2


def test_a_self_routing_policy_names_its_strategy_in_the_task_and_the_record():
    from adaptive_rag.routing.hot_swap import FixedRouter
    from adaptive_rag.routers.self_routing import self_routing_policy

    svc, store, queue, _routed = service()
    svc.router = FixedRouter("self-route", self_routing_policy("self-route"))
    answered = run(svc.answer(Answer(KEY, b"Who founded the company that makes the X200?", None, soon()), CallProgress()))
    task = queue.tasks[-1]
    assert (task.tier, task.strategy) == (Tier.B, "self_route")
    assert store.decisions[answered.request_id].strategy == "self_route"
    # Two questions in one still go to C, with C's own strategy, not the self-routing one.
    two = "Which plan is required for the Lumora Developer API, and what is its rate limit?"
    run(svc.answer(Answer(KEY, two.encode(), None, soon()), CallProgress()))
    assert (queue.tasks[-1].tier, queue.tasks[-1].strategy) == (Tier.C, "decompose")
    with pytest.raises(ValueError, match="self-route, uncertainty"):
        self_routing_policy("astrology")
