"""approval: a schedule's approval policy and last editor; a run's approval, and its three new states

* `task_schedule.approval`: the ApprovalPolicy as JSON (NULL: firings start at once);
  `task_schedule.last_edited_by`: who last created, updated or re-scoped it (the two-person rule).
* `task_schedule_run`: `approval` (the RunApproval as JSON) and `approval_expires_at` (the expiry sweep's
  column); its `state` may also be "awaiting_approval", "expired" or "rejected", and is 32 characters wide
  (was 16: "awaiting_approval" has 17).
* `uq_task_schedule_run_awaiting`: at most one run of a schedule awaits approval. No run before this
  revision has that state, so no existing row can break it. `ix_task_schedule_run_approval_expires_at`:
  the expiry sweep reads only the awaiting runs.

SQLite cannot change a CHECK constraint in place, so the batch operation rebuilds `task_schedule_run`
there; dropping the old table would fire `tasks.run_id`'s ON DELETE SET NULL, so the links are kept aside
and put back, as 0012 did.

Revision ID: 0018
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime, json_type

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

OLD_STATES = "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped')"
NEW_STATES = (
    "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped', "
    "'awaiting_approval', 'expired', 'rejected')"
)
AWAITING_WHERE = sa.text("state = 'awaiting_approval'")


def _rebuild_runs(check: str, add_columns: bool) -> None:
    rebuilds = op.get_bind().dialect.name == "sqlite"
    if rebuilds:
        op.execute(
            "CREATE TEMPORARY TABLE task_run_link AS SELECT id, run_id FROM tasks WHERE run_id IS NOT NULL"
        )
    with op.batch_alter_table("task_schedule_run", schema=None) as batch_op:
        if add_columns:
            batch_op.add_column(sa.Column("approval", json_type(), nullable=True))
            batch_op.add_column(sa.Column("approval_expires_at", UTCDateTime(), nullable=True))
        batch_op.drop_constraint(op.f("ck_task_schedule_run_state"), type_="check")
        batch_op.alter_column(
            "state",
            existing_type=sa.String(length=16 if add_columns else 32),
            type_=sa.String(length=32 if add_columns else 16),
            existing_nullable=False,
        )
        batch_op.create_check_constraint("state", sa.text(check))
        if not add_columns:
            batch_op.drop_column("approval_expires_at")
            batch_op.drop_column("approval")
    if rebuilds:
        op.execute(
            "UPDATE tasks SET run_id = (SELECT kept.run_id FROM task_run_link AS kept WHERE kept.id = tasks.id) "
            "WHERE id IN (SELECT id FROM task_run_link)"
        )
        op.execute("DROP TABLE task_run_link")


def upgrade() -> None:
    op.add_column("task_schedule", sa.Column("approval", json_type(), nullable=True))
    op.add_column(
        "task_schedule", sa.Column("last_edited_by", sa.String(length=255), server_default="", nullable=False)
    )
    _rebuild_runs(NEW_STATES, add_columns=True)
    op.create_index(
        "uq_task_schedule_run_awaiting",
        "task_schedule_run",
        ["schedule_id"],
        unique=True,
        postgresql_where=AWAITING_WHERE,
        sqlite_where=AWAITING_WHERE,
    )
    op.create_index(
        "ix_task_schedule_run_approval_expires_at",
        "task_schedule_run",
        ["approval_expires_at"],
        postgresql_where=AWAITING_WHERE,
        sqlite_where=AWAITING_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_task_schedule_run_approval_expires_at", table_name="task_schedule_run")
    op.drop_index("uq_task_schedule_run_awaiting", table_name="task_schedule_run")
    # The approval states do not exist before this revision: a run that never started ends as "skipped".
    op.execute(
        "UPDATE task_schedule_run SET state = 'skipped' "
        "WHERE state IN ('awaiting_approval', 'expired', 'rejected')"
    )
    _rebuild_runs(OLD_STATES, add_columns=False)
    op.drop_column("task_schedule", "last_edited_by")
    op.drop_column("task_schedule", "approval")
