"""tenants' knowledge bases, API key scopes, answerability of results

`api_keys.scopes` (existing keys keep answering and giving feedback; knowledge-base writes need a
new key with `kb:write`), `results.answerable` / `abstain_reason`, and the `knowledge_bases` /
`kb_documents` tables that describe each tenant's index.

Revision ID: 0004_tenant_knowledge
Revises: 0003_domain_error_codes
Create Date: 2026-12-01 03:40:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004_tenant_knowledge"
down_revision: Union[str, Sequence[str], None] = "0003_domain_error_codes"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("scopes", sa.String(128), nullable=False, server_default="answer,feedback"))
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("answerable", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("abstain_reason", sa.Text(), nullable=True))
    op.create_table(
        "knowledge_bases",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("documents", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("chunks", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "kb_documents",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("doc_id", sa.String(256), primary_key=True),
        sa.Column("source", sa.String(512), nullable=False, server_default=""),
        sa.Column("title", sa.Text(), nullable=False, server_default=""),
        sa.Column("chunks", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("content_sha256", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_kb_documents_tenant_source", "kb_documents", ["tenant", "source"])


def downgrade() -> None:
    op.drop_index("ix_kb_documents_tenant_source", table_name="kb_documents")
    op.drop_table("kb_documents")
    op.drop_table("knowledge_bases")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("abstain_reason")
        batch.drop_column("answerable")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("scopes")
