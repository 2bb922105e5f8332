"""knowledge_bases: each knowledge base's own abstention threshold and the operator's override

`abstain_threshold` is derived from the knowledge base whenever it is written
(`adaptive_rag.knowledge.calibration`; `abstain_calibration` says how), `abstain_override` is set
by `arag kb threshold`. Knowledge bases written before this revision have neither: they abstain
only when nothing is retrieved until their next write or `arag kb calibrate`.

Revision ID: 0009_kb_abstention
Revises: 0008_request_enqueued_at
Create Date: 2026-12-05 10:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009_kb_abstention"
down_revision: Union[str, Sequence[str], None] = "0008_request_enqueued_at"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.add_column(sa.Column("abstain_threshold", sa.Float(), nullable=True))
        batch.add_column(sa.Column("abstain_calibration", sa.JSON().with_variant(JSONB(), "postgresql"),
                                   nullable=True))
        batch.add_column(sa.Column("abstain_override", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.drop_column("abstain_override")
        batch.drop_column("abstain_calibration")
        batch.drop_column("abstain_threshold")
