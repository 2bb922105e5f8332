"""requests.runs: the primary runs a request began over its whole life

`deliveries` counts the deliveries of the request's current task that began its run and starts
afresh when a resend re-admits the request (the delivery cap is per message); `runs` is counted
by the same statement (`RecordStore.begin_run`) and never reset, so a request that ran twice
(a message delivered again after its worker died, a retry, a resend after a retryable error)
shows it though it has one result row. Rows written before this revision start from their
`deliveries`, the runs that are still known.

Revision ID: 0010_request_runs
Revises: 0009_kb_abstention
Create Date: 2026-12-05 12:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0010_request_runs"
down_revision: Union[str, Sequence[str], None] = "0009_kb_abstention"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("runs", sa.Integer(), nullable=False, server_default="0"))
    requests = sa.table("requests", sa.column("runs", sa.Integer), sa.column("deliveries", sa.Integer))
    op.execute(requests.update().values(runs=requests.c.deliveries))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("runs")
