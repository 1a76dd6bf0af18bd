"""failing_streak_checks: the schedules whose failing streak must be looked at again (issue 27)

`pause_failing` (the `pause_after_failed_runs` check every dispatcher runs after each poll) read every
schedule using it, each one's newest counted runs and every task of those runs, on every poll: 0.9 s a
poll at 1,000 schedules and 17 s at 10,000 on PostgreSQL (docs/PERFORMANCE.md, issue 27). Now a write that can change a streak (a task of
a run ending, a run recorded or changing state, the schedule saved) marks its schedule in this table, in
the same transaction, and the check looks only at the marked schedules.

The table starts with every enabled schedule that pauses after failures, so the first look after the
upgrade decides them all, as the old check did on every poll.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "failing_streak_checks",
        sa.Column("schedule_id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["task_schedule.id"],
            name="fk_failing_streak_checks_schedule_id_task_schedule",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("schedule_id", name="pk_failing_streak_checks"),
    )
    op.execute(
        "INSERT INTO failing_streak_checks (schedule_id) SELECT id FROM task_schedule "
        "WHERE pause_after_failed_runs > 0 AND enabled"
    )


def downgrade() -> None:
    op.drop_table("failing_streak_checks")
