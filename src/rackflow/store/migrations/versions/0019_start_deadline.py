"""start deadline and pause after failing runs (docs/SAFETY.md)

* `task_schedule.start_deadline_us`: how late a dispatched firing may start (NULL: the server's
  `--default-start-deadline`; 0: none).
* `task_schedule.pause_after_failed_runs` (0: never) and `failures_counted_until` (runs fired at or before
  it do not count: the streak that last paused the schedule); `ix_task_schedule_pause_after_failed_runs`
  indexes the few enabled rows the dispatcher's streak scan reads.
* `task_schedule_run.late_by_us`: how late a missed run was found; its `state` may also be "missed".

SQLite cannot change a CHECK constraint in place, so the batch operation rebuilds `task_schedule_run`
there; the tasks' links to their runs (ON DELETE SET NULL) are kept aside and put back, as 0012 does.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"

OLD_STATES = (
    "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped', "
    "'awaiting_approval', 'expired', 'rejected')"
)
NEW_STATES = (
    "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped', "
    "'awaiting_approval', 'expired', 'rejected', 'missed')"
)
PAUSING_PG = sa.text("pause_after_failed_runs > 0 AND enabled IS true")
PAUSING_SQLITE = sa.text("pause_after_failed_runs > 0 AND enabled IS 1")


def _rebuild_runs(check: str, add_columns: bool) -> None:
    rebuilds = op.get_bind().dialect.name == "sqlite"
    if rebuilds:
        op.execute(
            "CREATE TEMPORARY TABLE task_run_link AS SELECT id, run_id FROM tasks WHERE run_id IS NOT NULL"
        )
    with op.batch_alter_table("task_schedule_run", schema=None) as batch_op:
        if add_columns:
            batch_op.add_column(sa.Column("late_by_us", sa.BigInteger(), nullable=True))
        batch_op.drop_constraint(op.f("ck_task_schedule_run_state"), type_="check")
        batch_op.create_check_constraint("state", sa.text(check))
        if not add_columns:
            batch_op.drop_column("late_by_us")
    if rebuilds:
        op.execute(
            "UPDATE tasks SET run_id = (SELECT kept.run_id FROM task_run_link AS kept WHERE kept.id = tasks.id) "
            "WHERE id IN (SELECT id FROM task_run_link)"
        )
        op.execute("DROP TABLE task_run_link")


def upgrade() -> None:
    op.add_column("task_schedule", sa.Column("start_deadline_us", sa.BigInteger(), nullable=True))
    op.add_column(
        "task_schedule",
        sa.Column("pause_after_failed_runs", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "task_schedule", sa.Column("failures_counted_until", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "ix_task_schedule_pause_after_failed_runs",
        "task_schedule",
        ["id"],
        postgresql_where=PAUSING_PG,
        sqlite_where=PAUSING_SQLITE,
    )
    _rebuild_runs(NEW_STATES, add_columns=True)


def downgrade() -> None:
    # A missed run submitted nothing: before this revision it reads as a completed run with no task.
    op.execute("UPDATE task_schedule_run SET state = 'completed' WHERE state = 'missed'")
    _rebuild_runs(OLD_STATES, add_columns=False)
    op.drop_index("ix_task_schedule_pause_after_failed_runs", table_name="task_schedule")
    for column in ("failures_counted_until", "pause_after_failed_runs", "start_deadline_us"):
        op.drop_column("task_schedule", column)
