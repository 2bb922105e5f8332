"""training_labels: classifier training labels (benchmark now, live traffic later)

Revision ID: 0001_training_labels
Revises:
Create Date: 2026-11-29 22:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_training_labels"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "training_labels",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("dataset", sa.String(64), nullable=False),
        sa.Column("question_id", sa.String(128), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("label", sa.String(1), nullable=False),
        sa.Column("label_source", sa.String(16), nullable=False),
        sa.Column("split", sa.String(16), nullable=False),
        sa.Column("correct_metric", sa.String(16), nullable=False),
        sa.Column("outcomes", JSONType, nullable=False),
        sa.Column("labeller", JSONType, nullable=True),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("origin", "dataset", "question_id", name="uq_training_labels_key"),
        sa.CheckConstraint("label IN ('A', 'B', 'C')", name="ck_training_labels_label"),
    )
    op.create_index("ix_training_labels_split_label", "training_labels", ["split", "label"])
    op.create_index("ix_training_labels_request_id", "training_labels", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_training_labels_request_id", table_name="training_labels")
    op.drop_index("ix_training_labels_split_label", table_name="training_labels")
    op.drop_table("training_labels")
