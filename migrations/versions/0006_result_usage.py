"""LLM usage of every result: prompt and completion tokens and their estimated cost

Workers sum the tokens of each run's generations and price them with
`ARAG_PRICE_PER_1K_PROMPT_TOKENS` / `ARAG_PRICE_PER_1K_COMPLETION_TOKENS` (default 0: the embedded
model). Rows written before this migration read as 0 tokens and 0 cost.

Revision ID: 0006_result_usage
Revises: 0005_model_promotions
Create Date: 2026-12-02 09:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006_result_usage"
down_revision: Union[str, Sequence[str], None] = "0005_model_promotions"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("prompt_tokens", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("completion_tokens", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("cost", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("cost")
        batch.drop_column("completion_tokens")
        batch.drop_column("prompt_tokens")
