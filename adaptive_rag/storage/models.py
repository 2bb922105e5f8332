"""SQLAlchemy 2 models. Every schema change gets an Alembic revision in `migrations/versions/`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON, BigInteger, CheckConstraint, DateTime, Index, Integer, String, Text, UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (indexable), plain JSON (text) on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# BIGSERIAL on PostgreSQL; SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

LABELS = ("A", "B", "C")
# silver: the cheapest correct strategy; binary: none was correct, the dataset's bias decided.
# Later sources (live traffic): feedback (user verdicts), shadow (neighbouring-tier runs).
LABEL_SOURCES = ("silver", "binary", "feedback", "shadow")


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
