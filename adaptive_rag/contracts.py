"""The serving vocabulary: every enum, name and message that crosses a process or layer boundary.

The front door, the workers, the records store and the classifier all speak these types; each
edge serialises them (Celery JSON, SQL rows, protobuf) and parses them back into the same types,
so a reply built from a live result and one built from a stored row cannot differ. Every name that
two components must agree on (queues, the task, the model and its tensors) is spelled here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field


class Tier(StrEnum):
    """Query complexity tiers of Adaptive-RAG, cheapest first."""

    A = "A"  # no retrieval
    B = "B"  # single step
    C = "C"  # multi step


TIERS: tuple[Tier, ...] = (Tier.A, Tier.B, Tier.C)  # also the classifier's output order
TIER_VALUES: tuple[str, ...] = tuple(t.value for t in TIERS)  # "A", "B", "C", cheapest first


class StrategyName(StrEnum):
    """The answering strategies, by the name tasks, records and reports carry."""

    NO_RETRIEVAL = "no_retrieval"  # tier A: the reader alone
    SINGLE_STEP = "single_step"  # tier B: one retrieval, one answer
    IRCOT = "ircot"  # tier C: retrieval interleaved with chain-of-thought steps
    DECOMPOSE = "decompose"  # tier C: sub-questions, each with its own retrieval
    SELF_ROUTE = "self_route"  # single step escalating to multi step when the reader abstains
    UNCERTAINTY = "uncertainty"  # no retrieval escalating to single step when the draft is unsure
    SMALL_TALK = "small_talk"  # a canned reply to a greeting or thanks, chosen at admission

    def __repr__(self) -> str:  # as the plain name: messages read 'ircot', not <StrategyName.IRCOT: 'ircot'>
        return repr(self.value)


class RequestStatus(StrEnum):
    """Where one request is; `set_status` never moves a finished request back in flight."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"
    REJECTED = "rejected"  # its tier's queue was full; nothing ran
    ROUTED = "routed"  # a decision only (Route): the client runs the strategy itself
    # Queued past the expiry age and never started (its message lost, or not picked up before
    # any client's deadline): nothing runs it until its client resends it.
    EXPIRED = "expired"


IN_FLIGHT = frozenset({RequestStatus.QUEUED, RequestStatus.RUNNING})
FINISHED = frozenset({RequestStatus.DONE, RequestStatus.ERROR})
# A request that never ran may be admitted again when its client resends the same client_request_id.
NEVER_RAN = frozenset({RequestStatus.REJECTED, RequestStatus.EXPIRED})


class ResultKind(StrEnum):
    PRIMARY = "primary"  # the answer the client gets
    SHADOW = "shadow"  # a neighbouring tier's run, for unbiased labels


class Scope(StrEnum):
    """What an API key may do; the tenant always comes from the key, never from a request."""

    ANSWER = "answer"  # Answer, Route, GetResult
    FEEDBACK = "feedback"  # SubmitFeedback
    KB_WRITE = "kb:write"  # change the tenant's knowledge base (reading its description needs any scope)


DEFAULT_SCOPES: frozenset[Scope] = frozenset({Scope.ANSWER, Scope.FEEDBACK})


class ErrorCode(StrEnum):
    """Why a worker recorded an error instead of an answer (the front door maps these to gRPC)."""

    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"  # retriever, LLM or database away after retries
    TIME_LIMIT = "time_limit"  # the tier's time limit ended the run
    INTERNAL = "internal"  # a bug, or a task that kept killing its worker


# A request whose run ended with one of these may pass (a dependency was away): a resend with its
# client_request_id runs it again. Every other recorded error (a time limit, a bug, a task that
# kept killing its worker) is final: a resend returns it.
RETRYABLE_ERRORS = frozenset({ErrorCode.DEPENDENCY_UNAVAILABLE})


# --- names two processes must agree on -------------------------------------------------------------

ANSWER_TASK = "adaptive_rag.answer"
QUEUE_FOR_TIER: MappingProxyType[Tier, str] = MappingProxyType(
    {Tier.A: "tier-a", Tier.B: "tier-b", Tier.C: "tier-c"}
)
SHADOW_QUEUE = "shadow"
# Comparison setup only (lab/experiments/queue_isolation.py): every tier's primary task on one queue.
SHARED_QUEUE = "shared"
# Which tier a shadow run tries: one step dearer, except C, which tries the cheaper B.
SHADOW_TIER: MappingProxyType[Tier, Tier] = MappingProxyType(
    {Tier.A: Tier.B, Tier.B: Tier.C, Tier.C: Tier.B}
)

CLASSIFIER_MODEL = "complexity"  # the model's name in the Triton model repository
CLASSIFIER_INPUTS = ("input_ids", "attention_mask")  # INT64 [batch, sequence]
CLASSIFIER_OUTPUT = "logits"  # FP32 [batch, 3], in `TIERS` order
RULES_MODEL = "rules"  # the model name recorded when the rules fallback decided
SMALL_TALK_MODEL = "small_talk"  # ... when the small-talk detector decided (tier A, no classifier)


# --- messages --------------------------------------------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Principal(_Message):
    """Who is calling: the tenant an API key belongs to and what the key may do."""

    tenant: str
    scopes: frozenset[Scope] = DEFAULT_SCOPES

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes


class RoutingDecision(_Message):
    """The tier chosen for one query and why; recorded with every request.

    `strategy` and `classify_ms` are filled in by the admission step (the policy knows neither).
    """

    tier: Tier
    probabilities: dict[str, float] | None = None  # {"A": p, "B": p, "C": p}; None: rules decided
    model_name: str = RULES_MODEL
    model_version: int | None = None
    fallback: bool = False
    reason: str = ""
    strategy: str = ""
    classify_ms: float = 0.0


class AnswerTask(_Message):
    """What a worker is asked to do: run `strategy` for `tier` on `query`, retrieving only from
    `tenant`'s knowledge base."""

    request_id: str
    tenant: str
    query: str
    tier: Tier
    strategy: str
    kind: ResultKind = ResultKind.PRIMARY
    enqueued_at: float = Field(description="Unix time the front door sent it (queue wait)")

    @property
    def task_id(self) -> str:
        """The primary run's task id is the request id (anyone holding it can wait for the
        result); a shadow run adds its kind and tier."""
        return task_id_for(self.request_id, self.kind, self.tier)


def task_id_for(request_id: str, kind: ResultKind = ResultKind.PRIMARY, tier: Tier | None = None) -> str:
    """The queue's task id of a run (`parse_task_id` reads it back)."""
    return request_id if kind is ResultKind.PRIMARY else f"{request_id}.{kind.value}.{tier}"


class Source(_Message):
    id: str
    title: str
    score: float = 0.0


class Timings(_Message):
    queue_wait_ms: float = 0.0
    strategy_ms: float = 0.0
    retrieve_ms: float = 0.0
    generate_ms: float = 0.0


class AnswerResult(_Message):
    """What a worker produced for one task: an answer, or an error code with its detail."""

    request_id: str
    kind: ResultKind = ResultKind.PRIMARY
    tier: Tier
    strategy: str
    answer: str | None = None
    steps: int = 0
    sources: tuple[Source, ...] = ()
    timings: Timings = Timings()
    error: str | None = None
    error_code: ErrorCode | None = None
    # False when the knowledge base does not support an answer (`abstain_reason` says why);
    # `answer` then holds what the client may show while a human takes over.
    answerable: bool = True
    abstain_reason: str | None = None
    # LLM tokens the run spent and their estimated cost (tokens x `ARAG_PRICE_PER_1K_*_TOKENS`
    # / 1000; 0 with the embedded model's default price of 0).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_code is None


# --- records and task ids, as the serving use cases read them ---------------------------------------


@dataclass(frozen=True, slots=True)
class RequestView:
    """One recorded request, as the records return it (no ORM object crosses a layer)."""

    request_id: str
    tenant: str
    client_request_id: str | None
    query: str
    status: RequestStatus
    created_at: datetime
    updated_at: datetime
    deliveries: int = 0  # deliveries of the primary task that began its run (`begin_run`)


class TaskRef(NamedTuple):
    """What a task id names: the request, the run's kind and, for a shadow run, its tier."""

    request_id: str
    kind: ResultKind
    tier: Tier | None


def parse_task_id(task_id: str) -> TaskRef:
    """The run a task id names; the inverse of `task_id_for` (a primary run's id names no tier)."""
    request_id, _, rest = task_id.partition(".")
    kind, _, tier = rest.partition(".")
    return TaskRef(request_id, ResultKind(kind or ResultKind.PRIMARY), Tier(tier) if tier else None)
