"""knowledge_bases.answer_style: each tenant's answer style (NULL: the deployment's)

`answer_style` is `short` or `support` (`adaptive_rag.contracts.AnswerStyle`), set by
`arag kb style`; knowledge bases written before this revision answer in the deployment's
`ARAG_ANSWER_STYLE`.

Revision ID: 0011_support_conversations
Revises: 0009_kb_abstention
Create Date: 2026-12-06 10:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011_support_conversations"
down_revision: Union[str, Sequence[str], None] = "0009_kb_abstention"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.add_column(sa.Column("answer_style", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.drop_column("answer_style")
