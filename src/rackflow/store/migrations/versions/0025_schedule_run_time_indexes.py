"""task_schedule: the list by next or last run reads an index (issue 29)

ListTaskSchedules (and the dashboard's schedule list) ordered by `next_run_at` or `last_run_at` sorted
every schedule for each page: 1.0–1.5 s at a million (docs/PERFORMANCE.md, issue 29). Each index below is
the column, then the ties' order (creation time, id): a page of the rows with a time is a range of it (read
backwards for `desc`, ties re-sorted within their group), and the rows without one, which sort last in
either direction, are its `IS NULL` range in creation order.

The cost, written where the trade-off is measured (docs/PERFORMANCE.md, "Sorted by next or last run"):
every firing updates both columns of its schedule, so each firing writes one more entry into each index.
A firing's update was already not a HOT update (`ix_task_schedule_due` holds `next_run_at`).

Created IF NOT EXISTS, as 0022's: an operator of a large PostgreSQL database may build them first with
`CREATE INDEX CONCURRENTLY` (writes go on) and this migration then finds them.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_task_schedule_next_run_at_created_at_id", ["next_run_at", "created_at", "id"]),
    ("ix_task_schedule_last_run_at_created_at_id", ["last_run_at", "created_at", "id"]),
)


def upgrade() -> None:
    for name, columns in INDEXES:
        op.create_index(name, "task_schedule", columns, if_not_exists=True)


def downgrade() -> None:
    for name, _ in reversed(INDEXES):
        op.drop_index(name, table_name="task_schedule", if_exists=True)
