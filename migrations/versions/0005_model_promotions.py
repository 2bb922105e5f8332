"""model promotions: every promote / retrain / rollback decision, its scores and its reason

Promotion compares challenger and champion on the validation split carved from `train`; the
verdict, both scores, the validation labels per tier and the version served afterwards are kept
here, and a rollback is recorded beside them. A retrain's `label_watermark` is where the next one
starts counting new labels.

Revision ID: 0005_model_promotions
Revises: 0004_tenant_knowledge
Create Date: 2026-12-01 07:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005_model_promotions"
down_revision: Union[str, Sequence[str], None] = "0004_tenant_knowledge"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "model_promotions",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("model_name", sa.String(64), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("challenger_run", sa.Text(), nullable=True),
        sa.Column("challenger_version", sa.Integer(), nullable=True),
        sa.Column("champion_version", sa.Integer(), nullable=True),
        sa.Column("served_version", sa.Integer(), nullable=True),
        sa.Column("metric", sa.String(32), nullable=True),
        sa.Column("challenger_score", sa.Float(), nullable=True),
        sa.Column("champion_score", sa.Float(), nullable=True),
        sa.Column("validation_counts", JSON, nullable=True),
        sa.Column("new_labels", sa.Integer(), nullable=True),
        sa.Column("label_watermark", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column("details", JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("action IN ('promote', 'retrain', 'rollback')", name="ck_model_promotions_action"),
        sa.CheckConstraint(
            "verdict IN ('promoted', 'refused', 'failed', 'skipped', 'rolled_back')",
            name="ck_model_promotions_verdict",
        ),
    )
    op.create_index("ix_model_promotions_model_created", "model_promotions", ["model_name", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_model_promotions_model_created", table_name="model_promotions")
    op.drop_table("model_promotions")
