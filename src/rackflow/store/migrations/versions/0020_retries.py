"""retries: a schedule's retry policy, a task's attempts, and the run a run re-ran

* `task_schedule.retry`: the schedule's RetryPolicy (JSON; NULL: one attempt).
* `tasks.retry` (the policy as submitted), `tasks.attempt` (the current attempt, from 1; existing tasks
  are on their first), `tasks.attempt_started_at` (when the current attempt started).
* `task_attempt`: each ended attempt of a task with retries (ON DELETE CASCADE with its task).
* `task_schedule_run.retry_of` (indexed): the run RetryTaskScheduleRun re-ran. No foreign key, so SQLite
  rebuilds nothing: every change is an added nullable (or defaulted) column or a new table.

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime, json_type

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("task_schedule", sa.Column("retry", json_type(), nullable=True))
    op.add_column("tasks", sa.Column("retry", json_type(), nullable=True))
    op.add_column("tasks", sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("tasks", sa.Column("attempt_started_at", UTCDateTime(), nullable=True))
    op.add_column("task_schedule_run", sa.Column("retry_of", sa.Uuid(), nullable=True))
    op.create_index("ix_task_schedule_run_retry_of", "task_schedule_run", ["retry_of"])
    op.create_table(
        "task_attempt",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("retryable", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_task_attempt_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", "attempt", name="pk_task_attempt"),
    )


def downgrade() -> None:
    op.drop_table("task_attempt")
    op.drop_index("ix_task_schedule_run_retry_of", table_name="task_schedule_run")
    for table, column in (
        ("task_schedule_run", "retry_of"),
        ("tasks", "attempt_started_at"),
        ("tasks", "attempt"),
        ("tasks", "retry"),
        ("task_schedule", "retry"),
    ):
        op.drop_column(table, column)
