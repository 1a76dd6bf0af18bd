"""runs and scopes: the indexes `--run-retention` and `--task-retention` prune by

* `ix_task_schedule_run_fired_at_id` (fired_at, id): the run pruner takes the oldest runs of every
  schedule, oldest first, in chunks; without it each chunk reads the whole run table.
* `ix_task_schedule_scope_last_task_id`: deleting a task sets the `last_task_id` of the scopes naming it to
  NULL (ON DELETE SET NULL), which PostgreSQL looks up once per deleted task; without it every deleted
  task reads every scope.

Only indexes: no row changes, nothing rebuilt.

Revision ID: 0010
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_task_schedule_run_fired_at_id", "task_schedule_run", ["fired_at", "id"])
    op.create_index("ix_task_schedule_scope_last_task_id", "task_schedule_scope", ["last_task_id"])


def downgrade() -> None:
    op.drop_index("ix_task_schedule_scope_last_task_id", table_name="task_schedule_scope")
    op.drop_index("ix_task_schedule_run_fired_at_id", table_name="task_schedule_run")
