"""In-memory stand-ins for the serving ports: records, task queue, result waiter and router (unit
tests only; the integration and e2e tests use the real RecordStore, Celery workers and Triton)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from adaptive_rag.contracts import (
    DEFAULT_SCOPES, IN_FLIGHT, NEVER_RAN, QUEUE_FOR_TIER, RETRYABLE_ERRORS, Principal, Scope, AnswerResult,
    AnswerTask, ConversationTurn, RequestStatus, ResultKind, RoutingDecision, Source, Tier, Timings, parse_task_id,
)
from adaptive_rag.domain import Passage
from adaptive_rag.errors import DuplicateRequestError, RequestNotFoundError
from adaptive_rag.routing.policy import fallback_decision


@dataclass
class Request:
    request_id: str
    tenant: str
    client_request_id: str | None
    query: str
    status: RequestStatus = RequestStatus.QUEUED
    deliveries: int = 0
    shadow_deliveries: int = 0
    runs: int = 0
    updated_at: float = field(default_factory=time.time)  # when it last changed (expiry age)
    enqueued_at: float | None = None  # when its task was marked published (the outbox mark)
    conversation_id: str | None = None
    standalone_query: str | None = None
    rewrite: str | None = None
    created_at: float = field(default_factory=time.time)

    @property
    def searched_query(self) -> str:
        return self.standalone_query or self.query


class FakeStore:
    """Dict-backed records with the RecordStore contract (duplicates, tenants, statuses)."""

    def __init__(self) -> None:
        self.keys: dict[str, Principal] = {}
        self.key_changes = 0  # the key table's revision
        self.requests: dict[str, Request] = {}
        self.decisions: dict[str, RoutingDecision] = {}
        self.results: dict[tuple[str, ResultKind, Tier], AnswerResult] = {}
        self.feedback: list[dict] = []
        self.statuses: list[tuple[str, RequestStatus]] = []
        self.workers: dict[str, str] = {}  # who wrote a request answered at admission
        self._ids = itertools.count(1)
        self.lock = threading.Lock()

    def ping(self) -> None:
        if getattr(self, "down", None) is not None:
            raise self.down

    def add_key(self, key: str, tenant: str, scopes: frozenset[Scope] = DEFAULT_SCOPES) -> None:
        self.keys[hashlib.sha256(key.encode()).hexdigest()] = Principal(tenant=tenant, scopes=scopes)
        self.key_changes += 1

    def revoke_key(self, key: str) -> None:
        del self.keys[hashlib.sha256(key.encode()).hexdigest()]
        self.key_changes += 1

    def principal_for_key(self, key: str) -> Principal | None:
        return self.keys.get(hashlib.sha256(key.encode()).hexdigest())

    def api_keys_revision(self) -> int:
        return self.key_changes

    def find_request(self, tenant, client_request_id):
        return self._find(tenant, client_request_id)

    def _find(self, tenant, client_request_id):
        for r in self.requests.values():
            if r.tenant == tenant and r.client_request_id == client_request_id:
                return replace(r)
        return None

    def get_request(self, request_id):
        r = self.requests.get(request_id)
        return replace(r) if r else None

    def create_request(self, request_id, tenant, client_request_id, query, status=RequestStatus.QUEUED,
                       decision=None, conversation_id=None, standalone_query=None, rewrite=None):
        with self.lock:
            if client_request_id is not None and self._find(tenant, client_request_id):
                raise DuplicateRequestError(client_request_id)
            self.requests[request_id] = Request(request_id, tenant, client_request_id, query,
                                                RequestStatus(status), conversation_id=conversation_id or request_id,
                                                standalone_query=standalone_query, rewrite=rewrite)
            if decision is not None:
                self.decisions[request_id] = decision
            return replace(self.requests[request_id])

    def record_answered(self, request_id, tenant, client_request_id, query, decision, result, worker,
                        conversation_id=None, standalone_query=None, rewrite=None):
        """RecordStore's contract: the finished request, its decision and result, at once."""
        with self.lock:
            if client_request_id is not None and self._find(tenant, client_request_id):
                raise DuplicateRequestError(client_request_id)
            status = RequestStatus.DONE if result.ok else RequestStatus.ERROR
            self.requests[request_id] = Request(request_id, tenant, client_request_id, query, status,
                                                conversation_id=conversation_id or request_id,
                                                standalone_query=standalone_query, rewrite=rewrite)
            request = self.requests[request_id]
            request.runs = request.deliveries = 1
            request.enqueued_at = time.time()
            self.decisions[request_id] = decision
            self.results[(request_id, result.kind, result.tier)] = result
            self.workers[request_id] = worker

    def mark_enqueued(self, request_id):
        request = self.requests[request_id]
        if request.enqueued_at is None:
            request.enqueued_at = time.time()

    def publish_unpublished(self, publish, older_than_s, request_id=None):
        """RecordStore's contract without row locks (the lock stands in for them)."""
        cutoff = time.time() - older_than_s
        published = []
        with self.lock:
            for r in list(self.requests.values()):
                if (r.status is not RequestStatus.QUEUED or r.enqueued_at is not None
                        or r.updated_at > cutoff or r.request_id not in self.decisions
                        or request_id not in (None, r.request_id)):
                    continue
                decision = self.decisions[r.request_id]
                publish(AnswerTask(request_id=r.request_id, tenant=r.tenant, query=r.searched_query,
                                   tier=decision.tier, strategy=decision.strategy, enqueued_at=time.time()))
                r.enqueued_at = r.updated_at = time.time()
                published.append(r.request_id)
        return published

    def undelivered(self, older_than_s):
        """RecordStore's contract: queued, published that long ago, never delivered; oldest first."""
        cutoff = time.time() - older_than_s
        with self.lock:
            found = [r for r in self.requests.values() if r.status is RequestStatus.QUEUED and not r.deliveries
                     and r.enqueued_at is not None and r.enqueued_at <= cutoff]
        return [r.request_id for r in sorted(found, key=lambda r: r.enqueued_at)]

    def publish_lost(self, publish, request_ids, older_than_s):
        """RecordStore's contract without row locks: those of `request_ids` still undelivered."""
        still = set(self.undelivered(older_than_s)) & set(request_ids)
        published = []
        with self.lock:
            for request_id in (r for r in request_ids if r in still):
                r, decision = self.requests[request_id], self.decisions[request_id]
                publish(AnswerTask(request_id=r.request_id, tenant=r.tenant, query=r.searched_query,
                                   tier=decision.tier, strategy=decision.strategy, enqueued_at=time.time()))
                r.enqueued_at = r.updated_at = time.time()
                published.append(r.request_id)
        return published

    def conversation_turns(self, tenant, conversation_id, since, limit):
        """RecordStore's contract: the tenant's turns since `since`, oldest first; None if none."""
        turns = sorted((r for r in self.requests.values()
                        if r.tenant == tenant and r.conversation_id == conversation_id
                        and r.created_at >= since.timestamp()), key=lambda r: r.created_at)[-limit:]
        if not turns:
            return None
        answers = {rid: res.answer or "" for (rid, kind, _), res in self.results.items()
                   if kind is ResultKind.PRIMARY}
        return [ConversationTurn(r.request_id, r.searched_query, answers.get(r.request_id, ""))
                for r in turns]

    def record_decision(self, request_id: str, decision: RoutingDecision) -> None:
        self.decisions[request_id] = decision

    def decision_for(self, request_id):
        return self.decisions.get(request_id)

    def set_status(self, request_id, status):
        self.requests[request_id].status = RequestStatus(status)
        self.requests[request_id].updated_at = time.time()
        self.statuses.append((request_id, RequestStatus(status)))

    def begin_run(self, request_id, kind=ResultKind.PRIMARY, tenant=None):
        with self.lock:
            request = self.requests.get(request_id)
            if request is None or (tenant is not None and request.tenant != tenant):
                raise RequestNotFoundError(request_id)
            if ResultKind(kind) is ResultKind.SHADOW:
                request.shadow_deliveries += 1
                return request.shadow_deliveries
            if request.status not in IN_FLIGHT:
                return None
            request.status, request.updated_at = RequestStatus.RUNNING, time.time()
            request.deliveries += 1
            request.runs += 1
            self.statuses.append((request_id, RequestStatus.RUNNING))
            return request.deliveries

    def readmit(self, request_id):
        with self.lock:
            request = self.requests[request_id]
            key = (request_id, ResultKind.PRIMARY)
            failed = [k for k, r in self.results.items()
                      if k[:2] == key and r.error_code in RETRYABLE_ERRORS]
            if request.status not in NEVER_RAN and not (request.status is RequestStatus.ERROR and failed):
                return False
            for k in failed:
                del self.results[k]
            request.status, request.deliveries, request.updated_at = RequestStatus.QUEUED, 0, time.time()
            request.enqueued_at = None
            self.statuses.append((request_id, RequestStatus.QUEUED))
            return True

    def expire_queued(self, older_than_s):
        if getattr(self, "sweeping", False):  # another replica holds the sweep
            return None
        cutoff = time.time() - older_than_s
        with self.lock:
            expired = [r for r in self.requests.values()
                       if r.status is RequestStatus.QUEUED and r.updated_at < cutoff]
            for request in expired:
                request.status, request.updated_at = RequestStatus.EXPIRED, time.time()
            return [r.request_id for r in expired]

    def save_result(self, result: AnswerResult, worker: str, attempts: int) -> bool:
        key = (result.request_id, result.kind, result.tier)
        with self.lock:
            if key in self.results:
                return False
            self.results[key] = result
        if result.kind is ResultKind.PRIMARY:
            self.requests[result.request_id].status = RequestStatus.DONE if result.ok else RequestStatus.ERROR
        return True

    def get_result(self, request_id, kind=ResultKind.PRIMARY, tier=None):
        for (rid, k, t), result in self.results.items():
            if rid == request_id and k == kind and (tier is None or t == tier):
                return result
        return None

    def add_feedback(self, request_id, tenant, rating, correct_answer, comment):
        r = self.requests.get(request_id)
        if r is None or r.tenant != tenant:
            raise RequestNotFoundError(request_id)
        self.feedback.append({"request_id": request_id, "rating": rating,
                              "correct_answer": correct_answer, "comment": comment})
        return next(self._ids)


class FakeQueue:
    """Runs `work(task) -> AnswerResult` on a thread after `delay_s` and stores the result, as a
    worker would; `done[task_id]` is set when it is stored."""

    def __init__(self, store: FakeStore, work: Callable[[AnswerTask], AnswerResult] | None = None,
                 delay_s: float = 0.0) -> None:
        self.store = store
        self.work = work or default_work
        self.delay_s = delay_s
        self.depths: dict[str, int] = {}
        self.tasks: list[AnswerTask] = []
        self.done: dict[str, threading.Event] = {}
        self.down: Exception | None = None  # raised by enqueue and depth while set (broker away)
        self.forgotten: list[str] = []
        self.lost: set[str] = set()  # tasks the broker no longer holds (`held`)
        self.tells = True

    def queue_name(self, tier: Tier) -> str:
        return QUEUE_FOR_TIER[Tier(tier)]

    def held(self, task_ids):
        """The broker's view: every task enqueued and not yet taken by the fake worker, minus
        those a test took off (`lost`); None when `tells` is off (a broker that cannot tell)."""
        if not self.tells:
            return None
        return {task_id for task_id in task_ids
                if any(t.task_id == task_id for t in self.tasks) and task_id not in self.lost}

    def enqueue(self, task: AnswerTask) -> None:
        if self.down is not None:
            raise self.down
        self.tasks.append(task)
        done = self.done.setdefault(task.task_id, threading.Event())

        def run() -> None:
            time.sleep(self.delay_s)
            self.store.save_result(self.work(task), "fake-worker", 1)
            done.set()

        threading.Thread(target=run, daemon=True).start()

    def depth(self, queue: str) -> int:
        if self.down is not None:
            raise self.down
        return self.depths.get(queue, 0)

    def forget(self, task_id: str) -> None:
        """Drop the finished run's stored result, as the result backend's delete does."""
        if self.down is not None:
            raise self.down
        self.forgotten.append(task_id)
        self.done.pop(task_id, None)


class FakeWaiter:
    """Waits for a FakeQueue task's stored result."""

    def __init__(self, queue: FakeQueue) -> None:
        self.queue = queue

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def wait(self, task_id: str, timeout: float) -> AnswerResult:
        done = self.queue.done.setdefault(task_id, threading.Event())
        if not await asyncio.to_thread(done.wait, timeout):
            raise TimeoutError(f"no result within {timeout} s")
        result = self.queue.store.get_result(*parse_task_id(task_id))
        assert result is not None
        return result


def default_work(task: AnswerTask) -> AnswerResult:
    return AnswerResult(
        request_id=task.request_id, kind=task.kind, tier=task.tier, strategy=task.strategy,
        answer=f"answer to {task.query}", steps=1, sources=(Source(id="p1", title="Lumora", score=2.5),),
        timings=Timings(queue_wait_ms=3.0, strategy_ms=40.0),
    )


class FakeRouter:
    """Routes by a dict of query -> tier (default B); `fallback=True` mimics Triton being down."""

    model_name = "complexity"

    def __init__(self, tiers: dict[str, str] | None = None, version: int = 1) -> None:
        self.tiers = tiers or {}
        self.version = version
        self.fallback = False

    async def route(self, query: str, tenant: str | None = None) -> RoutingDecision:
        if self.fallback:
            return fallback_decision(query, "Triton down")
        tier = Tier(self.tiers.get(query, "B"))
        probs = {"A": 0.1, "B": 0.1, "C": 0.1, tier.value: 0.8}
        return RoutingDecision(tier=tier, probabilities=probs, model_name=self.model_name,
                               model_version=self.version, reason=f"argmax {tier.value}")

    async def poll_forever(self) -> None:  # the real one polls the model repository
        return None

    def close(self) -> None:
        return None


class WordOverlapRetriever:
    """Search by shared lower-cased words, each worth 1 (`ports.QueryWeigher` too: a query weighs
    its distinct words, so relevance is the share of them the best chunk has)."""

    def __init__(self, chunks: dict[str, Passage]) -> None:
        self.chunks = chunks

    @staticmethod
    def _words(text: str) -> set[str]:
        return set(text.lower().split())

    def search(self, query: str, k: int) -> list[Passage]:
        asked = self._words(query)
        scored = [(len(asked & self._words(f"{c.title} {c.text}")), c) for c in self.chunks.values()]
        ranked = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1].id))
        return [replace(chunk, score=float(score)) for score, chunk in ranked[:k]]

    def query_weight(self, query: str) -> float:
        return float(len(self._words(query)))


class FakeKnowledgeIndex:
    """Per-tenant dicts of chunks with the KnowledgeIndex contract (no BM25: word overlap)."""

    def __init__(self) -> None:
        self.chunks: dict[str, dict[str, Passage]] = {}
        self.generations: dict[str, int] = {}

    def upsert(self, tenant: str, chunks) -> None:
        self.chunks.setdefault(tenant, {}).update({c.id: c for c in chunks})
        self.generations.setdefault(tenant, 1)

    def delete(self, tenant: str, chunk_ids) -> None:
        for chunk_id in chunk_ids:
            self.chunks.get(tenant, {}).pop(chunk_id, None)

    def rebuild(self, tenant: str, chunks) -> int:
        self.chunks[tenant] = {c.id: c for c in chunks}
        self.generations[tenant] = self.generations.get(tenant, 0) + 1
        return self.generations[tenant]

    def exists(self, tenant: str) -> bool:
        return tenant in self.chunks

    def count(self, tenant: str) -> int:
        return len(self.chunks.get(tenant, {}))

    def retriever(self, tenant: str) -> WordOverlapRetriever:
        return WordOverlapRetriever(self.chunks.setdefault(tenant, {}))


def knowledge_service(tenants_with_kb=("acme", "globex")):
    """A real KnowledgeBaseService over the fake index and SQLite records, with a document for
    each of `tenants_with_kb`."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import StaticPool

    from adaptive_rag.knowledge.documents import Document, Section
    from adaptive_rag.knowledge.service import KnowledgeBaseService
    from adaptive_rag.storage import Base, KnowledgeRecords

    engine = create_engine("sqlite://", poolclass=StaticPool,
                           connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    service = KnowledgeBaseService(FakeKnowledgeIndex(), KnowledgeRecords(engine), backend="fake")
    for tenant in tenants_with_kb:
        service.upsert(tenant, [Document("welcome", "Welcome", (Section("", f"{tenant} help centre"),))])
    return service
