"""task_schedule: a due index the dispatcher's claim can use

The claim filters `enabled IS true` (SQLAlchemy's `.is_(True)`; `enabled IS 1` on SQLite), and both
PostgreSQL and SQLite match a partial index's predicate by its spelling, not its meaning: the 0001 index,
`WHERE enabled AND ...`, was never used and every poll scanned the whole table. The new index spells the
predicate as the query does and adds `id`, the claim's tie-breaker, so a burst of schedules due at the same
minute is read in index order instead of being sorted on every poll.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_WHERE = sa.text("enabled AND next_run_at IS NOT NULL")
NEW_POSTGRESQL_WHERE = sa.text("enabled IS true AND next_run_at IS NOT NULL")
NEW_SQLITE_WHERE = sa.text("enabled IS 1 AND next_run_at IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("task_schedule", schema=None) as batch_op:
        batch_op.drop_index("ix_task_schedule_due", postgresql_where=OLD_WHERE, sqlite_where=OLD_WHERE)
        batch_op.create_index(
            "ix_task_schedule_due",
            ["next_run_at", "id"],
            unique=False,
            postgresql_where=NEW_POSTGRESQL_WHERE,
            sqlite_where=NEW_SQLITE_WHERE,
        )


def downgrade() -> None:
    with op.batch_alter_table("task_schedule", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_task_schedule_due", postgresql_where=NEW_POSTGRESQL_WHERE, sqlite_where=NEW_SQLITE_WHERE
        )
        batch_op.create_index(
            "ix_task_schedule_due",
            ["next_run_at"],
            unique=False,
            postgresql_where=OLD_WHERE,
            sqlite_where=OLD_WHERE,
        )
