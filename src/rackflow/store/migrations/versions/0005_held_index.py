"""tasks: a partial index on the holds the dead-hold sweep looks for

Once per lease period every executor asks which racks have a cancelled task still held by a dead instance
(`status = 'terminated' AND owner_id IS NOT NULL AND NOT EXISTS (live instance)`). No index answered it, so
each ask read every ended task. Only tasks some instance holds have an owner: running tasks and the few
cancelled ones whose executor has not let go yet. Indexing just those rows keeps the index as small as the
live work. The predicate is the query's literal `owner_id IS NOT NULL`, spelled the same on both databases,
and not its `status = $1`: psycopg prepares a statement after a few runs, and PostgreSQL's generic plan for
it cannot prove a partial index predicate from a parameter, so it would fall back to the full scan.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

HELD_WHERE = sa.text("owner_id IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(
            "ix_tasks_held", ["owner_id"], unique=False, postgresql_where=HELD_WHERE, sqlite_where=HELD_WHERE
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_held", postgresql_where=HELD_WHERE, sqlite_where=HELD_WHERE)
