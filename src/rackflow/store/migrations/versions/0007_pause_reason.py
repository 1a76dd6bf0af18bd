"""task_schedule: why a schedule is paused, by whom, since when, and until when

`pause_reason`, `paused_by` (empty when not known), `paused_at` and `resume_at` (NULL: until resumed by
hand) are set by PauseTaskSchedule and cleared by a resume. Schedules paused before this revision keep an
empty reason and no end. The partial index `ix_task_schedule_resume_at` serves the dispatcher's scan for
pauses that have ended, which only ever sees the few schedules with an end.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"

RESUME_WHERE = sa.text("resume_at IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("task_schedule") as batch:
        batch.add_column(sa.Column("pause_reason", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("paused_by", sa.String(255), nullable=False, server_default=""))
        batch.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("resume_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_task_schedule_resume_at",
        "task_schedule",
        ["resume_at"],
        postgresql_where=RESUME_WHERE,
        sqlite_where=RESUME_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_task_schedule_resume_at", table_name="task_schedule")
    with op.batch_alter_table("task_schedule") as batch:
        batch.drop_column("resume_at")
        batch.drop_column("paused_at")
        batch.drop_column("paused_by")
        batch.drop_column("pause_reason")
