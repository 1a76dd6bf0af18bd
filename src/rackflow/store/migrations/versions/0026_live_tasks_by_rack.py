"""tasks: a partial index of each rack's live tasks (issue 29)

Every submission, a firing's included, reads the live tasks of its racks (`blocking_and_waiting`: active
ones, and cancelled ones still held). Per rack that is zero to a few rows, but no index held exactly them:
PostgreSQL either read the rack's whole history through `ix_tasks_rack_id_status` (hundreds of ended tasks
a rack in a year, each fetched from the heap to test `owner_id`), or, as it did on a loaded database,
every live task of the fleet through `ix_tasks_active` and `ix_tasks_held`, once per rack of the batch:
1,700 heap pages a rack while a drain of 2,000 was under way (docs/PERFORMANCE.md, "The drain among a
loaded history"). This index holds only live tasks, by rack; its predicate is the query's, literally.
PostgreSQL only: on SQLite, with statistics, its presence turned the dead-hold sweep from `ix_tasks_held`
to a read of every cancelled task by the status index (tests/store/test_held_index.py), and SQLite, an
embedded database of one instance, reads a rack's tasks by `ix_tasks_rack_id_status` as before.

Created IF NOT EXISTS: an operator of a large PostgreSQL database may build it first with
`CREATE INDEX CONCURRENTLY` (docs/OPERATIONS.md) and this migration then finds it.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

LIVE_WHERE = sa.text("status IN ('pending', 'running', 'waiting') OR owner_id IS NOT NULL")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index(
        "ix_tasks_live_rack_id", "tasks", ["rack_id"], postgresql_where=LIVE_WHERE, if_not_exists=True
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_tasks_live_rack_id", table_name="tasks", if_exists=True)
