"""request status `expired`; deliveries counted per request; an index for the expiry sweep

A request still `queued` past the front door's expiry age (`ARAG_QUEUED_EXPIRY`) was never
started: the sweeper moves it to `expired`, which a resend with its client_request_id admits
again. `deliveries` / `shadow_deliveries` count the deliveries of its primary / shadow task that
began the run, so a task whose run keeps killing its whole worker stops being run after
`ARAG_TASK_MAX_DELIVERIES`. Rows written before this migration count 0 deliveries.

Revision ID: 0007_request_expiry_deliveries
Revises: 0006_result_usage
Create Date: 2026-12-03 09:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007_request_expiry_deliveries"
down_revision: Union[str, Sequence[str], None] = "0006_result_usage"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# Frozen here on purpose: a migration must not change when the code's vocabulary does.
OLD_STATUSES = ("queued", "running", "done", "error", "rejected", "routed")
NEW_STATUSES = (*OLD_STATUSES, "expired")


def _status_check(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("deliveries", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("shadow_deliveries", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("ck_requests_status", type_="check")
        batch.create_check_constraint("ck_requests_status", _status_check(NEW_STATUSES))
        batch.create_index("ix_requests_status_updated_at", ["status", "updated_at"])


def downgrade() -> None:
    requests = sa.table("requests", sa.column("status", sa.String))
    # Expired requests never ran and may be resent: what `rejected` said before this revision.
    op.execute(requests.update().where(requests.c.status == "expired").values(status="rejected"))
    with op.batch_alter_table("requests") as batch:
        batch.drop_index("ix_requests_status_updated_at")
        batch.drop_constraint("ck_requests_status", type_="check")
        batch.create_check_constraint("ck_requests_status", _status_check(OLD_STATUSES))
        batch.drop_column("shadow_deliveries")
        batch.drop_column("deliveries")
