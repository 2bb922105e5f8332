"""domain error codes instead of gRPC status names; request statuses `routed` in, `expired` out

Results recorded an error as a gRPC status name (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL); they
now record the domain's `ErrorCode` and the front door maps it to a status. `expired` was never
set by any code: rows (if any) become `rejected` (never ran, may be resent). `routed` marks a
decision-only request (the Route RPC): classified and recorded, nothing run.

Revision ID: 0003_domain_error_codes
Revises: 0002_serving_records
Create Date: 2026-12-01 00:40:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003_domain_error_codes"
down_revision: Union[str, Sequence[str], None] = "0002_serving_records"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# Frozen here on purpose: a migration must not change when the code's vocabulary does.
CODES = {"UNAVAILABLE": "dependency_unavailable", "DEADLINE_EXCEEDED": "time_limit", "INTERNAL": "internal"}
OLD_STATUSES = ("queued", "running", "done", "error", "rejected", "expired")
NEW_STATUSES = ("queued", "running", "done", "error", "rejected", "routed")


def _status_check(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _recode(mapping: dict[str, str]) -> None:
    results = sa.table("results", sa.column("error_code", sa.String))
    for old, new in mapping.items():
        op.execute(results.update().where(results.c.error_code == old).values(error_code=new))
    # Any other recorded name was an unknown status: the front door treated it as INTERNAL.
    known = list(mapping.values())
    op.execute(
        results.update()
        .where(results.c.error_code.is_not(None), results.c.error_code.not_in(known))
        .values(error_code=mapping.get("INTERNAL", "INTERNAL"))
    )


def upgrade() -> None:
    _recode(CODES)
    requests = sa.table("requests", sa.column("status", sa.String))
    op.execute(requests.update().where(requests.c.status == "expired").values(status="rejected"))
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint("ck_requests_status", type_="check")
        batch.create_check_constraint("ck_requests_status", _status_check(NEW_STATUSES))


def downgrade() -> None:
    requests = sa.table("requests", sa.column("status", sa.String))
    op.execute(requests.update().where(requests.c.status == "routed").values(status="done"))
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint("ck_requests_status", type_="check")
        batch.create_check_constraint("ck_requests_status", _status_check(OLD_STATUSES))
    _recode({new: old for old, new in CODES.items()})
