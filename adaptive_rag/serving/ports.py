"""What the serving use cases need from the outside world, as Protocols.

Adapters: `adaptive_rag.storage.RecordStore` (records), `workers.client` (task queue and result
waiter over Celery), `adaptive_rag.routing.hot_swap.ClassifierRouter` (router over Triton). Unit
tests pass in-memory fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from datetime import datetime
from typing import Protocol

from adaptive_rag.contracts import (
    AnswerResult, AnswerTask, ConversationTurn, Principal, RequestStatus, RequestView, ResultKind,
    RoutingDecision, Tier,
)


class Records(Protocol):
    """Requests, routing decisions, results and feedback (blocking calls); a database that does
    not answer is `DatabaseUnavailableError`."""

    def ping(self) -> None: ...  # raises when the records cannot be reached
    def principal_for_key(self, key: str) -> Principal | None: ...
    def api_keys_revision(self) -> Hashable:
        """A value that changes whenever a key is revoked (or created, or deleted)."""
        ...
    def find_request(self, tenant: str, client_request_id: str) -> RequestView | None: ...
    def get_request(self, request_id: str) -> RequestView | None: ...
    def create_request(
        self, request_id: str, tenant: str, client_request_id: str | None, query: str,
        status: RequestStatus = RequestStatus.QUEUED, decision: RoutingDecision | None = None,
        conversation_id: str | None = None, standalone_query: str | None = None,
        rewrite: str | None = None,
    ) -> RequestView: ...
    def record_answered(
        self, request_id: str, tenant: str, client_request_id: str | None, query: str,
        decision: RoutingDecision, result: AnswerResult, worker: str,
        conversation_id: str | None = None, standalone_query: str | None = None,
        rewrite: str | None = None,
    ) -> None:
        """A request answered at admission: finished, with its decision and result, at once."""
        ...
    def conversation_turns(self, tenant: str, conversation_id: str, since: datetime,
                           limit: int) -> list[ConversationTurn] | None:
        """The conversation's last `limit` turns since `since`, oldest first; None when the
        tenant has no such conversation (or none of its turns is that recent)."""
        ...
    def mark_enqueued(self, request_id: str) -> None:
        """Mark the request's task as handed to the broker (the row is the task's outbox)."""
        ...
    def publish_unpublished(
        self, publish: Callable[[AnswerTask], None], older_than_s: float,
        request_id: str | None = None,
    ) -> list[str]:
        """`publish` the task of each request still queued, never marked enqueued and unchanged
        for `older_than_s` (or of `request_id` only), mark them; their ids. Replicas take
        disjoint rows."""
        ...
    def undelivered(self, older_than_s: float) -> list[str]:
        """Requests queued, published at least `older_than_s` ago and never delivered (waiting
        in the queue, or lost on the way to a worker)."""
        ...
    def publish_lost(
        self, publish: Callable[[AnswerTask], None], request_ids: Collection[str], older_than_s: float,
    ) -> list[str]:
        """`publish` again those of `request_ids` still undelivered that long after their
        publish, mark them; their ids. Replicas publish each one once."""
        ...
    def record_decision(self, request_id: str, decision: RoutingDecision) -> None: ...
    def decision_for(self, request_id: str) -> RoutingDecision | None: ...
    def set_status(self, request_id: str, status: RequestStatus) -> None: ...
    def begin_run(
        self, request_id: str, kind: ResultKind = ResultKind.PRIMARY, tenant: str | None = None,
    ) -> int | None:
        """Count a delivery that begins the run (primary: only while in flight, now `running`;
        also one more of the request's `runs`); the count so far, or None when the request is
        not in flight. With `tenant`, another tenant's request is not found."""
        ...
    def readmit(self, request_id: str) -> bool:
        """Queue again a resent request that may run again (never ran, or a retryable error)."""
        ...
    def expire_queued(self, older_than_s: float) -> list[str] | None:
        """Expire requests queued longer than that; their ids, or None while another sweeps."""
        ...
    def get_result(
        self, request_id: str, kind: ResultKind = ResultKind.PRIMARY, tier: Tier | None = None,
    ) -> AnswerResult | None: ...
    def save_result(self, result: AnswerResult, worker: str, attempts: int) -> bool: ...
    def add_feedback(
        self, request_id: str, tenant: str, rating: int, correct_answer: str | None, comment: str | None,
    ) -> int: ...


class TaskQueue(Protocol):
    """The tier queues (blocking calls)."""

    def enqueue(self, task: AnswerTask) -> None: ...
    def queue_name(self, tier: Tier) -> str: ...
    def depth(self, queue: str) -> int: ...
    def forget(self, task_id: str) -> None:
        """Drop a finished task's stored result (a re-admitted request's new run must not be
        answered by its old run's result)."""
        ...
    def held(self, task_ids: Collection[str]) -> set[str] | None:
        """Which of `task_ids` the broker holds, waiting in a queue or reserved by a worker;
        None when this broker cannot tell."""
        ...


class ResultWaiter(Protocol):
    """Waits for the result of a task that was enqueued (by this or another front door)."""

    async def wait(self, task_id: str, timeout: float) -> AnswerResult:
        """The task's result; raises `TimeoutError` when it is not there within `timeout` s."""
        ...


class Router(Protocol):
    """Classifier + policy (+ the caller tenant's prior); never raises (falls back to the rules,
    flagged)."""

    async def route(self, query: str, tenant: str | None = None) -> RoutingDecision: ...


class FairShare(Protocol):
    """Per-tenant admission: a rate limit (token bucket) and a share of each tier's queue (slots).

    Adapters: `services.frontdoor.fair_share.RedisFairShare` (shared by every front door replica)
    and `InMemoryFairShare` (one front door, embedded default). Blocking calls.
    """

    def acquire(self, tenant: str, tier: Tier, request_id: str) -> None:
        """Take one token of `tenant`'s bucket and one of its slots on `tier` for `request_id`,
        or take nothing and raise `OverShareError` with a retry-after hint. Acquiring again for a
        request that holds its slot is a no-op (a replayed admission)."""
        ...

    def release(self, tenant: str, tier: Tier, request_id: str) -> None:
        """Give the slot back (the answer arrived); unknown ids are ignored. A slot that is never
        released expires after the tier's lease."""
        ...
