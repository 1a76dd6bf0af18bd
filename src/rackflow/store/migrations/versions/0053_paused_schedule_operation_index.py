"""task_schedule: the paused schedules' list filtered by operation reads an index of its own (PostgreSQL)

ListTaskSchedules with `paused_only` and `operation_type` (`rackflow schedule list --paused-only --op`, the
schedule list page's `?state=paused&op=`) read the operation's index (migration 0051) in the list's order,
checking each schedule's row for its pause: for an operation many schedules run and few of them paused,
that is every schedule of the operation: 310 ms for an empty page over a million schedules, a fifth of
them of the operation and none paused (docs/PERFORMANCE.md, "The twenty-seventh stop"). This index holds
the paused schedules alone, by operation then in the list's order, so such a page is a range of it and its
count reads only its entries. A schedule that fires is not paused, so no firing writes an entry here.

Built CONCURRENTLY, outside a transaction, as 0051's (the fleet's writes go on while it builds); an invalid
index left by an interrupted build is dropped and built again (`dialect.building_index_concurrently`), and
a valid one built beforehand is kept (IF NOT EXISTS). The expression and the predicate are spelled as the
filters render them (`store.tables.schedule_operation`, `enabled IS false`), which PostgreSQL matches by
their spelling. SQLite: nothing (as 0051).

A release before it, still serving during a rolling upgrade, neither reads nor writes it by name: a pause
or a resume it makes writes or removes the schedule's entry as in every index.

Revision ID: 0053
Revises: 0052
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None

INDEX = "ix_task_schedule_paused_operation_kind"
OPERATION = sa.text("CAST((operation_template #>> '{operation, kind}') AS VARCHAR)")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    with op.get_context().autocommit_block(), building_index_concurrently(bind, INDEX):
        op.create_index(
            INDEX,
            "task_schedule",
            [OPERATION, "created_at", "id"],
            postgresql_where=sa.text("enabled IS false"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="task_schedule", if_exists=True)
