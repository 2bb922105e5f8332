"""What the front door's use cases are asked (one command each, as the edge received it) and what
they answer: the values a call carries travel together, not as loose arguments.

`AdmitRequest` is the Answer use case's own: a request once it is authenticated, valid, classified
and has its request id, which every later step (record, queue, wait, replay) works on.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_rag.contracts import AnswerResult, RequestView, RoutingDecision, Tier
from adaptive_rag.strategies.follow_up import Rewrite
from adaptive_rag.serving.context import CallProgress


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer `raw_query` (UTF-8 bytes) for the key's tenant by `deadline`, a `time.monotonic()`
    instant; a `client_request_id` makes a resend return (or run) the same request; a
    `conversation_id` (one an earlier Answer returned) makes it a turn of that conversation."""

    api_key: str
    raw_query: bytes
    client_request_id: str | None
    deadline: float
    conversation_id: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Classify `raw_query` and record the decision; nothing runs (the client runs the strategy)."""

    api_key: str
    raw_query: bytes


@dataclass(frozen=True, slots=True)
class GetResult:
    """The stored reply of an earlier Answer of the key's tenant."""

    api_key: str
    request_id: str


@dataclass(frozen=True, slots=True)
class SubmitFeedback:
    """A verdict on an earlier request of the key's tenant (-1 wrong, 0 none, 1 right)."""

    api_key: str
    request_id: str
    rating: int
    correct_answer: str | None = None
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """One request on its way through admission: who asked what, how it was routed, by when the
    reply is due, and the call's progress (stages, ids) that the edge reports."""

    request_id: str
    tenant: str
    query: str
    client_request_id: str | None
    decision: RoutingDecision
    deadline: float  # time.monotonic()
    started: float  # time.perf_counter() at receipt (a live reply's total_ms)
    progress: CallProgress
    # The conversation it continues (None: it starts its own) and the standalone question it
    # was rewritten into (None: not a follow-up, or used as sent).
    conversation_id: str | None = None
    rewrite: Rewrite | None = None

    @property
    def tier(self) -> Tier:
        return self.decision.tier

    @property
    def searched_query(self) -> str:
        """What is routed and what the strategies run on."""
        return self.rewrite.question if self.rewrite is not None and self.rewrite.changed else self.query

    @property
    def standalone_query(self) -> str | None:
        return self.searched_query if self.searched_query != self.query else None


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
    # The conversation the request is a turn of (continue it by sending this id), the question
    # it was rewritten into ("" when used as sent) and how (`RewriteMethod`; "" when not).
    conversation_id: str = ""
    rewritten_query: str = ""
    rewrite: str = ""

    @classmethod
    def stored(cls, request_id: str, decision: RoutingDecision, result: AnswerResult,
               view: RequestView | None = None) -> Answered:
        work_ms = decision.classify_ms + result.timings.queue_wait_ms + result.timings.strategy_ms
        return cls(request_id, decision, result, work_ms, replayed=True,
                   **(conversation_of(view) if view is not None else {}))


def conversation_of(view: RequestView) -> dict[str, str]:
    """A recorded request's conversation fields, as `Answered` carries them."""
    return {"conversation_id": view.conversation_id or "", "rewritten_query": view.standalone_query or "",
            "rewrite": view.rewrite or ""}
