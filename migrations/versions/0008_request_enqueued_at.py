"""requests.enqueued_at: when the request's task was handed to the broker (the outbox mark)

The request row is the outbox of its task: it is written with `enqueued_at` empty, the task is
published, and the row is marked. A row still `queued` and never marked a few seconds after it
was written lost its publish (the front door died between the two): every front door's relay
publishes it again (`RecordStore.publish_unpublished`). No index on the column: the relay finds
queued rows through `ix_requests_status_updated_at`, and leaving the column unindexed keeps the
mark a heap-only (HOT) update on PostgreSQL.

Rows written before this revision count as published: whether their task was ever sent cannot
be known now, and the expiry sweep still ends any that was not.

Revision ID: 0008_request_enqueued_at
Revises: 0007_request_expiry_deliveries
Create Date: 2026-12-03 22:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008_request_enqueued_at"
down_revision: Union[str, Sequence[str], None] = "0007_request_expiry_deliveries"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
    requests = sa.table("requests", sa.column("enqueued_at", sa.DateTime(timezone=True)),
                        sa.column("updated_at", sa.DateTime(timezone=True)))
    op.execute(requests.update().values(enqueued_at=requests.c.updated_at))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("enqueued_at")
