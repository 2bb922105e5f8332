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
    EVIDENCE = "evidence"  # tier C: the chain's few passages gathered by retrieval, read once
    SELF_ROUTE = "self_route"  # single step escalating to multi step when the reader abstains
    UNCERTAINTY = "uncertainty"  # no retrieval escalating to single step when the draft is unsure
    SMALL_TALK = "small_talk"  # a canned reply to a greeting or thanks, chosen at admission

    def __repr__(self) -> str:  # as the plain name: messages read 'ircot', not <StrategyName.IRCOT: 'ircot'>
        return repr(self.value)


class AnswerStyle(StrEnum):
    """How the reader answers: `short` is the span QA benchmarks score (a few words); `support`
    is what a customer needs: one to a few sentences or steps from the passages, citing them
    as [1], [2] (the reply's sources in order). Chosen per tenant; benchmarks read `short`."""

    SHORT = "short"
    SUPPORT = "support"


# A tenant that chose no style gets the deployment's (`ARAG_ANSWER_STYLE`), `support` by default;
# evaluation runs build their strategies with `short` unless told otherwise.
DEFAULT_TENANT_STYLE = AnswerStyle.SUPPORT


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


class CallError(StrEnum):
    """Why a call failed, as its client is told: a stable code (the front door's `x-error-code`
    trailer) with a stable message (`CALL_ERROR_MESSAGES`). What exactly happened (the exception's
    text, addresses, class names) stays in the server's log."""

    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    QUERY_EMPTY = "query_empty"
    QUERY_TOO_LONG = "query_too_long"
    QUERY_NOT_UTF8 = "query_not_utf8"
    QUERY_CONTROL_CHARACTER = "query_control_character"
    INVALID_CLIENT_REQUEST_ID = "invalid_client_request_id"
    INVALID_REQUEST_ID = "invalid_request_id"
    INVALID_CONVERSATION_ID = "invalid_conversation_id"
    INVALID_FEEDBACK = "invalid_feedback"
    INVALID_DOCUMENT = "invalid_document"
    TOO_MANY_DOCUMENTS = "too_many_documents"
    INVALID_REQUEST = "invalid_request"  # any other unusable field
    REQUEST_TOO_LARGE = "request_too_large"
    UNDECODABLE_REQUEST = "undecodable_request"
    KNOWLEDGE_BASE_MISSING = "knowledge_base_missing"
    KNOWLEDGE_BASE_BUSY = "knowledge_base_busy"
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    RESULT_STORE_UNAVAILABLE = "result_store_unavailable"
    QUEUE_FULL = "queue_full"
    OVER_SHARE = "over_share"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_RECORDED = "not_recorded"
    REQUEST_NOT_FOUND = "request_not_found"
    CONVERSATION_NOT_FOUND = "conversation_not_found"
    CLIENT_REQUEST_ID_REUSED = "client_request_id_reused"
    NOT_FINISHED = "not_finished"
    NEVER_RAN = "never_ran"
    ROUTE_ONLY = "route_only"
    ANSWER_DEPENDENCY_UNAVAILABLE = "answer_dependency_unavailable"
    ANSWER_TIME_LIMIT = "answer_time_limit"
    ANSWER_FAILED = "answer_failed"
    INTERNAL = "internal"


# The one message per code; a call that has a request id gets " (request <id>)" appended.
CALL_ERROR_MESSAGES: MappingProxyType[CallError, str] = MappingProxyType({
    CallError.UNAUTHENTICATED:
        "missing, unknown or revoked API key: send `authorization: Bearer <api key>` with a valid key",
    CallError.PERMISSION_DENIED: "this API key lacks the scope this call needs (answer, feedback or kb:write)",
    CallError.QUERY_EMPTY: "the query is empty",
    CallError.QUERY_TOO_LONG: "the query is longer than this service accepts",
    CallError.QUERY_NOT_UTF8: "the query is not valid UTF-8",
    CallError.QUERY_CONTROL_CHARACTER: "the query contains a control character (other than tab and line breaks)",
    CallError.INVALID_CLIENT_REQUEST_ID:
        "client_request_id must be printable text without spaces, within its length limit (omit it for none)",
    CallError.INVALID_REQUEST_ID: "request_id must be the id an Answer returned",
    CallError.INVALID_CONVERSATION_ID:
        "conversation_id must be the conversation_id an Answer returned (printable text without "
        "spaces, within its length limit); omit it to start a new conversation",
    CallError.INVALID_FEEDBACK:
        "feedback needs a rating of -1, 0 or 1; correct_answer and comment must be text within "
        "their length limit, without control characters",
    CallError.INVALID_DOCUMENT:
        "a document needs an id (without '#' or control characters), a title or text, and must be "
        "within the document size limit",
    CallError.TOO_MANY_DOCUMENTS: "too many documents in one UpsertDocuments call: use StreamDocuments",
    CallError.INVALID_REQUEST: "a field of the request is unusable",
    CallError.REQUEST_TOO_LARGE: "the request body is larger than the longest valid request of this method",
    CallError.UNDECODABLE_REQUEST:
        "the request body is not a valid protobuf message of this method (malformed, or a string "
        "field that is not UTF-8)",
    CallError.KNOWLEDGE_BASE_MISSING:
        "this tenant has no knowledge base yet: import its documents first (KnowledgeBase.UpsertDocuments)",
    CallError.KNOWLEDGE_BASE_BUSY: "another change to this tenant's knowledge base is running: send it again later",
    CallError.DEPENDENCY_UNAVAILABLE:
        "a service the front door needs is unreachable: send the call again (an Answer with the same "
        "client_request_id; a request that did not run then runs under the same request id)",
    CallError.RESULT_STORE_UNAVAILABLE:
        "the result store is unreachable; the request keeps running: call GetResult with its request id later",
    CallError.QUEUE_FULL: "the routed tier's queue is full: send it again later with the same client_request_id",
    CallError.OVER_SHARE:
        "this tenant is over its rate or its share of the routed tier: send it again after the "
        "retry-after trailer's seconds, with the same client_request_id",
    CallError.DEADLINE_EXCEEDED:
        "no answer within the deadline; the request keeps running: call GetResult with its request id",
    CallError.NOT_RECORDED: "the deadline passed before the request was recorded: send it again",
    CallError.REQUEST_NOT_FOUND: "no request with this id for this API key's tenant",
    CallError.CONVERSATION_NOT_FOUND:
        "no conversation with this id for this API key's tenant within the conversation retention: "
        "omit conversation_id to start a new one",
    CallError.CLIENT_REQUEST_ID_REUSED: "this client_request_id was already used for a different query: choose a new one",
    CallError.NOT_FINISHED: "the request is still queued or running: call GetResult again later",
    CallError.NEVER_RAN:
        "the request never ran (rejected or expired): send the Answer again with the same "
        "client_request_id to keep its request id",
    CallError.ROUTE_ONLY: "the request is a routing decision only (Route): nothing ran",
    CallError.ANSWER_DEPENDENCY_UNAVAILABLE:
        "a service the answer needs stayed unreachable through every retry: send the Answer again "
        "with the same client_request_id to run it again",
    CallError.ANSWER_TIME_LIMIT: "the run passed its tier's time limit",
    CallError.ANSWER_FAILED: "the answer failed in the worker (its logs say why)",
    CallError.INTERNAL: "internal error in the front door (its logs say why)",
})
# What the client is told of an error a worker recorded.
CALL_ERROR_FOR_WORKER_ERROR: MappingProxyType[ErrorCode, CallError] = MappingProxyType({
    ErrorCode.DEPENDENCY_UNAVAILABLE: CallError.ANSWER_DEPENDENCY_UNAVAILABLE,
    ErrorCode.TIME_LIMIT: CallError.ANSWER_TIME_LIMIT,
    ErrorCode.INTERNAL: CallError.ANSWER_FAILED,
})


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
    runs: int = 0  # primary runs begun over the request's life (a re-admission keeps counting)
    # The conversation it is a turn of, the standalone question it was routed and searched as
    # (None: the query as sent) and how that was made (`strategies.follow_up.RewriteMethod`).
    conversation_id: str | None = None
    standalone_query: str | None = None
    rewrite: str | None = None

    @property
    def searched_query(self) -> str:
        """What the strategies ran on: the standalone question, else the query."""
        return self.standalone_query or self.query


@dataclass(frozen=True, slots=True)
class ConversationTurn:
    """An earlier turn of a conversation as the records return it (oldest first)."""

    request_id: str
    question: str  # as it was searched (the standalone question)
    answer: str  # "" while it runs, or when it failed or abstained


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
