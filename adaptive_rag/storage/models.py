"""SQLAlchemy 2 models. Every schema change gets an Alembic revision in `migrations/versions/`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Index, Integer, String,
    Text, UniqueConstraint, func, true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from adaptive_rag.contracts import RequestStatus, ResultKind

# JSONB on PostgreSQL (indexable), plain JSON (text) on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# BIGSERIAL on PostgreSQL; SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class TrainingLabel(Base):
    """One labelled question for the complexity classifier.

    `origin` tells benchmark questions (labelled offline by `arag label`) from live traffic
    (labelled later from logged outcomes, shadow runs and feedback); `(origin, dataset,
    question_id)` is unique, which makes labelling resumable. `outcomes` keeps what each tier's
    strategy did: `{"A": {"strategy", "answer", "em", "f1", "acc", "correct", "steps",
    "seconds"}, "B": {...}, "C": {...}}`.
    """

    __tablename__ = "training_labels"
    __table_args__ = (
        UniqueConstraint("origin", "dataset", "question_id", name="uq_training_labels_key"),
        CheckConstraint("label IN ('A', 'B', 'C')", name="ck_training_labels_label"),
        Index("ix_training_labels_split_label", "split", "label"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    origin: Mapped[str] = mapped_column(String(16), default="benchmark")  # benchmark | live
    dataset: Mapped[str] = mapped_column(String(64))
    question_id: Mapped[str] = mapped_column(String(128))
    question: Mapped[str] = mapped_column(Text)
    label: Mapped[str] = mapped_column(String(1))
    label_source: Mapped[str] = mapped_column(String(16))
    split: Mapped[str] = mapped_column(String(16))  # train | test | live
    correct_metric: Mapped[str] = mapped_column(String(16))  # em | acc | em_or_acc
    outcomes: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # How the label was made: strategies per tier, LLM, retriever, top_k, ... (free-form).
    labeller: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    # Live traffic: the request the label came from.
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    def __repr__(self) -> str:
        return f"TrainingLabel({self.dataset}/{self.question_id}={self.label} {self.label_source})"


# --- serving records ---------------------------------------------------------------------------------

FEEDBACK_RATINGS = (-1, 0, 1)  # answer wrong / no verdict / answer right


def utcnow() -> datetime:
    """Timestamps are written by Python (microseconds, UTC) so SQLite and PostgreSQL agree."""
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every timestamp these models write is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _created_at() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), default=utcnow, server_default=func.now())


class ApiKey(Base):
    """An API key of one tenant. Only the sha256 of the key is stored; the prefix is for display."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64))
    # Comma-separated `Scope` values (answer, feedback, kb:write).
    scopes: Mapped[str] = mapped_column(String(128), default="answer,feedback", server_default="answer,feedback")
    created_at: Mapped[datetime] = _created_at()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class QueryRequest(Base):
    """One query as the front door accepted it; `status` follows it through queue and worker.

    `(tenant, client_request_id)` is unique so a client's retry finds the first request instead of
    running again (NULL client ids never collide). `deliveries` / `shadow_deliveries` count the
    deliveries of its primary / shadow task that began the run, so a task whose run keeps killing
    its whole worker is recognised after a restart (`RecordStore.begin_run`); `runs` counts the
    primary runs begun over the request's whole life (a re-admission starts `deliveries` afresh,
    never `runs`), so a request that ran twice shows it though it has one result row. The
    `(status, updated_at)` index serves the sweep for requests queued too long, and the relay
    for queued ones whose task was never published (`enqueued_at` NULL).
    """

    __tablename__ = "requests"
    __table_args__ = (
        UniqueConstraint("tenant", "client_request_id", name="uq_requests_tenant_client_id"),
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s.value}'" for s in RequestStatus) + ")",
            name="ck_requests_status",
        ),
        Index("ix_requests_status_updated_at", "status", "updated_at"),
        Index("ix_requests_tenant_conversation", "tenant", "conversation_id", "created_at"),
    )

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    client_request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    query: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=RequestStatus.QUEUED.value)
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow, server_default=func.now()
    )
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    shadow_deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When its task was handed to the broker; NULL until then (the row is the task's outbox:
    # `RecordStore.publish_unpublished` sends again a queued one never marked).
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The conversation this request is a turn of (an Answer's first turn: its own request id;
    # NULL before conversations were recorded), the standalone question the turn was rewritten
    # into, routed and searched (NULL: the query as sent), and how (`follow_up.RewriteMethod`).
    conversation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    standalone_query: Mapped[str | None] = mapped_column(Text, nullable=True)
    rewrite: Mapped[str | None] = mapped_column(String(16), nullable=True)


class RoutingDecision(Base):
    """How the router chose the tier of one request (classifier probabilities or rules fallback)."""

    __tablename__ = "routing_decisions"
    __table_args__ = (UniqueConstraint("request_id", name="uq_routing_decisions_request_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("requests.request_id", ondelete="CASCADE")
    )
    tier: Mapped[str] = mapped_column(String(1))
    strategy: Mapped[str] = mapped_column(String(32))
    # {"A": p, "B": p, "C": p}; NULL when the rules fallback decided.
    probabilities: Mapped[dict[str, float] | None] = mapped_column(JSONType, nullable=True)
    model_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    fallback: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    classify_ms: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = _created_at()


class QueryResult(Base):
    """What a worker produced for one request on one tier.

    `kind` is `primary` (the answer the client gets) or `shadow` (a neighbouring tier run for
    unbiased labels). `(request_id, kind, tier)` is unique: a task delivered twice writes one row,
    the first write wins.
    """

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("request_id", "kind", "tier", name="uq_results_request_kind_tier"),
        CheckConstraint(
            "kind IN (" + ", ".join(f"'{k.value}'" for k in ResultKind) + ")", name="ck_results_kind"
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("requests.request_id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(16))
    tier: Mapped[str] = mapped_column(String(1))
    strategy: Mapped[str] = mapped_column(String(32))
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    # [{"id", "title", "score"}]
    sources: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    # {"queue_wait_ms", "strategy_ms", "retrieve_ms", "generate_ms"}
    timings: Mapped[dict[str, float]] = mapped_column(JSONType, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(32), nullable=True)
    answerable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    abstain_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    worker: Mapped[str] = mapped_column(String(255), default="")
    # LLM tokens the run spent and their estimated cost (`Settings.llm_cost`), for cost per tier
    # and tenant in SQL.
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = _created_at()


class Feedback(Base):
    """A client's verdict on an answer: -1 wrong, 0 no verdict, 1 right; optionally the right one."""

    __tablename__ = "feedback"
    __table_args__ = (CheckConstraint("rating IN (-1, 0, 1)", name="ck_feedback_rating"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("requests.request_id", ondelete="CASCADE"), index=True
    )
    tenant: Mapped[str] = mapped_column(String(64))
    rating: Mapped[int] = mapped_column(Integer)
    correct_answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = _created_at()


# --- tenants' knowledge bases ------------------------------------------------------------------------


class KnowledgeBaseRow(Base):
    """One tenant's knowledge base: its index generation (a rebuild makes the next one), its size
    and its abstention threshold: the one derived from the knowledge base when it was last
    written (`knowledge.calibration`, with how it was derived) and the operator's override; and
    the answer style the operator chose for the tenant."""

    __tablename__ = "knowledge_bases"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    documents: Mapped[int] = mapped_column(Integer, default=0)
    chunks: Mapped[int] = mapped_column(Integer, default=0)
    abstain_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    abstain_calibration: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    abstain_override: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The tenant's answer style (`AnswerStyle`; NULL: the deployment's `ARAG_ANSWER_STYLE`).
    answer_style: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, server_default=func.now()
    )


class KnowledgeDocument(Base):
    """One document of a tenant's knowledge base: what its chunks in the index came from.

    `chunks` tells which chunk ids (`<doc_id>#0` ... `#chunks-1`) the index holds for it, so an
    update that shortens a document removes exactly the chunks that are left over;
    `content_sha256` lets an unchanged document skip re-indexing.
    """

    __tablename__ = "kb_documents"
    __table_args__ = (Index("ix_kb_documents_tenant_source", "tenant", "source"),)

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    doc_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    source: Mapped[str] = mapped_column(String(512), default="")
    title: Mapped[str] = mapped_column(Text, default="")
    chunks: Mapped[int] = mapped_column(Integer, default=0)
    content_sha256: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, server_default=func.now()
    )


# --- classifier model versions -----------------------------------------------------------------------


class ModelPromotion(Base):
    """One decision about which classifier version users get, and why.

    `action`: `promote` (`arag model promote`), `retrain` (`arag retrain`, scheduled or by hand:
    train a challenger, then promote) or `rollback`. `verdict`: `promoted`, `refused` (not better
    on validation), `failed` (did not load, Triton refused it, training failed), `skipped`
    (too few new labels, another run holding the lock) or `rolled_back`. Scores are the
    validation split's (`adaptive_rag.training.splits`), never `test`; `validation_counts` are its
    labels per tier. `served_version` is the version served after the action; `label_watermark`
    the highest `training_labels.id` a retrain saw, from which the next one counts new labels.
    """

    __tablename__ = "model_promotions"
    __table_args__ = (
        CheckConstraint("action IN ('promote', 'retrain', 'rollback')", name="ck_model_promotions_action"),
        CheckConstraint(
            "verdict IN ('promoted', 'refused', 'failed', 'skipped', 'rolled_back')",
            name="ck_model_promotions_verdict",
        ),
        Index("ix_model_promotions_model_created", "model_name", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    model_name: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[str] = mapped_column(String(16))
    challenger_run: Mapped[str | None] = mapped_column(Text, nullable=True)
    challenger_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    champion_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    served_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    metric: Mapped[str | None] = mapped_column(String(32), nullable=True)
    challenger_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    champion_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    # {"A": n, "B": n, "C": n}: the validation labels both were scored on
    validation_counts: Mapped[dict[str, int] | None] = mapped_column(JSONType, nullable=True)
    new_labels: Mapped[int | None] = mapped_column(Integer, nullable=True)
    label_watermark: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    # Both models' full validation metrics, the run's settings, the Tritons loaded, ...
    details: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = _created_at()
