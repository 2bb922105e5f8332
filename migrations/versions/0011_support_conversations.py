"""knowledge_bases.answer_style and requests' conversations

`knowledge_bases.answer_style` is `short` or `support` (`adaptive_rag.contracts.AnswerStyle`),
set by `arag kb style`; knowledge bases written before this revision answer in the deployment's
`ARAG_ANSWER_STYLE`. `requests.conversation_id` names the conversation a request is a turn of
(its first turn's request id), `standalone_query` the question a follow-up was rewritten into
(and routed and searched as), `rewrite` how; requests recorded before this revision belong to
no conversation.

Revision ID: 0011_support_conversations
Revises: 0010_request_runs
Create Date: 2026-12-06 10:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011_support_conversations"
down_revision: Union[str, Sequence[str], None] = "0010_request_runs"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.add_column(sa.Column("answer_style", sa.String(16), nullable=True))
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("conversation_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("standalone_query", sa.Text(), nullable=True))
        batch.add_column(sa.Column("rewrite", sa.String(16), nullable=True))
    op.create_index("ix_requests_tenant_conversation", "requests",
                    ["tenant", "conversation_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_requests_tenant_conversation", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("rewrite")
        batch.drop_column("standalone_query")
        batch.drop_column("conversation_id")
    with op.batch_alter_table("knowledge_bases") as batch:
        batch.drop_column("answer_style")
