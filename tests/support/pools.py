"""Real `celery worker` pools over a real broker and PostgreSQL records, as the integration tests
of the worker lifecycle drive them: the lab's stack with the parts they need (`POOL_PARTS`, no
front door: the tests start their own), what the front door would record and enqueue, and the
wait for the result row (the records, not Redis, are asked)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.contracts import AnswerResult, AnswerTask, RoutingDecision, Tier
from adaptive_rag.settings import Settings
from adaptive_rag.storage import RecordStore
from lab.harness.stack import LabStack, Parts
from workers.celery_app import create_app
from workers.client import CeleryTaskQueue
from workers.pools import WorkerPools
from workers.settings import WorkerSettings

QUERY = "What is the capital of France?"
# Redis and PostgreSQL (the tests give their addresses: the session's servers), no classifier, the
# instant LLM endpoint instead of the model (tasks take the time the tests ask for, no CPU).
POOL_PARTS = Parts(broker="redis", records="postgres", classifier="rules", retriever="tantivy", llm="instant")


@dataclass
class PoolStack:
    store: RecordStore
    library: Settings
    workers: WorkerSettings
    pools: WorkerPools

    @classmethod
    def of(cls, lab: LabStack) -> PoolStack:
        return cls(lab.store, lab.settings.library, lab.settings.workers, lab.pools)

    def app(self):
        return create_app(self.workers)


def send(stack: PoolStack, request_id: str, tier: Tier = Tier.A, strategy: str = "no_retrieval",
         query: str = QUERY) -> AnswerTask:
    """Enqueue the task of an already recorded request."""
    task = AnswerTask(request_id=request_id, tenant="acme", query=query, tier=tier, strategy=strategy,
                      enqueued_at=time.time())
    CeleryTaskQueue(stack.app()).enqueue(task)
    return task


def submit(stack: PoolStack, tier: Tier = Tier.A, strategy: str = "no_retrieval", query: str = QUERY) -> AnswerTask:
    """What the front door does: record the request and its routing, then enqueue it."""
    request_id = uuid.uuid4().hex
    stack.store.create_request(request_id, "acme", None, query,
                               decision=RoutingDecision(tier=tier, fallback=True, reason="test", strategy=strategy))
    return send(stack, request_id, tier, strategy, query)


def answered(store: RecordStore, request_ids: Sequence[str], timeout: float) -> list[AnswerResult]:
    """Every request's recorded result, in order, waiting up to `timeout` for all of them."""
    deadline = time.monotonic() + timeout
    results: dict[str, AnswerResult] = {}
    while time.monotonic() < deadline and len(results) < len(request_ids):
        for request_id in request_ids:
            if request_id not in results and (found := store.get_result(request_id)) is not None:
                results[request_id] = found
        if len(results) < len(request_ids):
            time.sleep(0.2)
    missing = [r for r in request_ids if r not in results]
    assert not missing, f"no result within {timeout:.0f} s for {missing}"
    return [results[r] for r in request_ids]
