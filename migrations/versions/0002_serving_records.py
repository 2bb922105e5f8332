"""serving records: api_keys, requests, routing_decisions, results, feedback

Revision ID: 0002_serving_records
Revises: 0001_training_labels
Create Date: 2026-11-30 00:20:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002_serving_records"
down_revision: Union[str, Sequence[str], None] = "0001_training_labels"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATUSES = ("queued", "running", "done", "error", "rejected", "expired")


def _created_at() -> sa.Column:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
    )


def _request_fk() -> sa.Column:
    return sa.Column(
        "request_id", sa.String(64),
        sa.ForeignKey("requests.request_id", ondelete="CASCADE"), nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("key_prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        _created_at(),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])
    op.create_table(
        "requests",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("client_request_id", sa.String(128), nullable=True),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _created_at(),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("tenant", "client_request_id", name="uq_requests_tenant_client_id"),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="ck_requests_status"
        ),
    )
    op.create_table(
        "routing_decisions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _request_fk(),
        sa.Column("tier", sa.String(1), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("probabilities", JSONType, nullable=True),
        sa.Column("model_name", sa.String(64), nullable=True),
        sa.Column("model_version", sa.Integer(), nullable=True),
        sa.Column("fallback", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("classify_ms", sa.Float(), nullable=False),
        _created_at(),
        sa.UniqueConstraint("request_id", name="uq_routing_decisions_request_id"),
    )
    op.create_table(
        "results",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _request_fk(),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tier", sa.String(1), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("sources", JSONType, nullable=False),
        sa.Column("timings", JSONType, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(32), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        _created_at(),
        sa.UniqueConstraint("request_id", "kind", "tier", name="uq_results_request_kind_tier"),
        sa.CheckConstraint("kind IN ('primary', 'shadow')", name="ck_results_kind"),
    )
    op.create_table(
        "feedback",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _request_fk(),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("rating", sa.Integer(), nullable=False),
        sa.Column("correct_answer", sa.Text(), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        _created_at(),
        sa.CheckConstraint("rating IN (-1, 0, 1)", name="ck_feedback_rating"),
    )
    op.create_index("ix_feedback_request_id", "feedback", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_feedback_request_id", table_name="feedback")
    op.drop_table("feedback")
    op.drop_table("results")
    op.drop_table("routing_decisions")
    op.drop_table("requests")
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    op.drop_table("api_keys")
