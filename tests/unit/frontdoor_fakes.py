"""In-memory stand-ins for the front door's store, dispatcher and classifier router (unit tests
only; the integration test uses the real RecordStore, Celery workers and Triton)."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from adaptive_rag.domain import Tier
from adaptive_rag.errors import DuplicateRequestError, RequestNotFoundError
from adaptive_rag.routing.policy import RoutingDecision, fallback_decision

from services.frontdoor.routing import Routed

QUEUES = {"A": "tier-a", "B": "tier-b", "C": "tier-c"}


@dataclass
class Request:
    request_id: str
    tenant: str
    client_request_id: str | None
    query: str
    status: str = "queued"


class FakeStore:
    """Dict-backed RecordStore with the same contract (duplicates, tenants, statuses)."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.requests: dict[str, Request] = {}
        self.decisions: dict[str, dict] = {}
        self.results: dict[tuple[str, str], dict] = {}
        self.feedback: list[dict] = []
        self.statuses: list[tuple[str, str]] = []
        self._ids = itertools.count(1)
        self.lock = threading.Lock()

    def add_key(self, key: str, tenant: str) -> None:
        self.keys[hashlib.sha256(key.encode()).hexdigest()] = tenant

    def tenant_for_key(self, key: str) -> str | None:
        return self.keys.get(hashlib.sha256(key.encode()).hexdigest())

    def find_request(self, tenant, client_request_id):
        for r in self.requests.values():
            if r.tenant == tenant and r.client_request_id == client_request_id:
                return replace(r)
        return None

    def get_request(self, request_id):
        r = self.requests.get(request_id)
        return replace(r) if r else None

    def create_request(self, request_id, tenant, client_request_id, query):
        with self.lock:
            if client_request_id is not None and self.find_request(tenant, client_request_id):
                raise DuplicateRequestError(client_request_id)
            self.requests[request_id] = Request(request_id, tenant, client_request_id, query)
            return replace(self.requests[request_id])

    def record_decision(self, request_id, **decision):
        self.decisions[request_id] = {"request_id": request_id, **decision}

    def set_status(self, request_id, status):
        self.requests[request_id].status = status
        self.statuses.append((request_id, status))

    def save_result(self, request_id, kind, result: dict) -> None:
        self.results.setdefault((request_id, kind), dict(result))
        if kind == "primary":
            self.requests[request_id].status = "error" if result.get("error") else "done"

    def get_result(self, request_id, kind="primary"):
        return self.results.get((request_id, kind))

    def decision_for(self, request_id):
        return self.decisions.get(request_id)

    def add_feedback(self, request_id, tenant, rating, correct_answer, comment):
        r = self.requests.get(request_id)
        if r is None or r.tenant != tenant:
            raise RequestNotFoundError(request_id)
        self.feedback.append({"request_id": request_id, "rating": rating,
                              "correct_answer": correct_answer, "comment": comment})
        return next(self._ids)


@dataclass
class Task:
    request_id: str
    query: str
    tier: str
    strategy: str
    kind: str
    done: threading.Event = field(default_factory=threading.Event)
    result: dict | None = None


class FakeDispatcher:
    """Runs `work(task) -> result dict` on a thread after `delay_s`, storing the result like a worker."""

    queue_for_tier = QUEUES

    def __init__(self, store: FakeStore, work: Callable[[Task], dict] | None = None, delay_s: float = 0.0) -> None:
        self.store = store
        self.work = work or default_work
        self.delay_s = delay_s
        self.depths: dict[str, int] = {}
        self.tasks: list[Task] = []

    def enqueue(self, request_id, query, tier, strategy, kind="primary"):
        task = Task(request_id, query, tier, strategy, kind)
        self.tasks.append(task)

        def run() -> None:
            time.sleep(self.delay_s)
            task.result = self.work(task)
            self.store.save_result(request_id, kind, task.result)
            task.done.set()

        threading.Thread(target=run, daemon=True).start()
        return task

    def queue_depth(self, queue):
        return self.depths.get(queue, 0)

    def wait_result(self, handle: Task, timeout: float) -> dict:
        if not handle.done.wait(timeout):
            raise TimeoutError(f"no result within {timeout} s")
        return handle.result

    def handle_for(self, request_id, kind="primary"):
        for task in self.tasks:
            if task.request_id == request_id and task.kind == kind:
                return task
        return None


def default_work(task: Task) -> dict:
    return {
        "request_id": task.request_id, "kind": task.kind, "tier": task.tier,
        "strategy": task.strategy, "answer": f"answer to {task.query}", "steps": 1,
        "sources": [{"id": "p1", "title": "Lumora", "score": 2.5}],
        "timings": {"queue_wait_ms": 3.0, "strategy_ms": 40.0}, "error": None, "error_code": None,
    }


class FakeRouter:
    """Routes by a dict of query -> tier (default B); `fallback=True` mimics Triton being down."""

    model_name = "complexity"

    def __init__(self, tiers: dict[str, str] | None = None, version: int = 1) -> None:
        self.tiers = tiers or {}
        self.version = version
        self.fallback = False

    async def route(self, query: str) -> Routed:
        if self.fallback:
            return Routed(fallback_decision(query, "Triton down"), "rules", None)
        tier = Tier(self.tiers.get(query, "B"))
        probs = {"A": 0.1, "B": 0.1, "C": 0.1, tier.value: 0.8}
        return Routed(RoutingDecision(tier, probs, str(self.version), False, f"argmax {tier.value}"),
                      self.model_name, self.version)

    async def poll_forever(self) -> None:  # the real one polls the model repository
        return None

    def close(self) -> None:
        return None
