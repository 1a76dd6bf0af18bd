"""tasks: the live tasks in the executors' queue order, so a claim reads as many as it takes (issue 29)

The executor's claim and the pre-flight checker's look at the head of the queue take the oldest live tasks
(`ORDER BY created_at, id LIMIT n`). No index held the live tasks in that order: `ix_tasks_active` is led by
the status, and `ix_tasks_created_at` holds every ended task ahead of the live ones. So PostgreSQL read
every live task and sorted them, at every claim: with 9,264 tasks pending among ten million ended, 9,400
buffers and 27 ms a claim of 15 (docs/PERFORMANCE.md, "At full size on a quiet machine"), a cost that grows
with the backlog a burst leaves. This index holds only the live tasks (the predicate is `is_active`'s,
literally), in the queue's order: a claim walks it from the oldest and stops once it has its tasks, 164
buffers and 1 ms. PostgreSQL only: SQLite, which rackflow never ANALYZEs, keeps reading the live tasks by
their status (`ix_tasks_active`) whatever the backlog, so there the index would only cost writes.

On PostgreSQL it is built CONCURRENTLY, outside a transaction, so the fleet's writes to `tasks` go on while
it builds (it reads the whole table: 11 s over ten million tasks); an invalid index left by an interrupted
build is dropped and built again (`dialect.building_index_concurrently`), and a valid one built beforehand
is kept (IF NOT EXISTS).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

INDEX = "ix_tasks_live_queue"
LIVE_WHERE = sa.text("status IN ('pending', 'running', 'waiting')")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    with op.get_context().autocommit_block(), building_index_concurrently(bind, INDEX):
        op.create_index(
            INDEX,
            "tasks",
            ["created_at", "id"],
            postgresql_where=LIVE_WHERE,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="tasks", if_exists=True)
