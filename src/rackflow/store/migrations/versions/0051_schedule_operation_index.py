"""task_schedule: the list filtered by operation reads an index of the operation (PostgreSQL)

ListTaskSchedules' `operation_type` (`rackflow schedule list --op`, the schedule list page's `?op=`)
filtered the schedules by the operation in their template (`operation_template #>> '{operation, kind}'`),
which no index held: PostgreSQL walked the list's order (creation time) reading each schedule's row until
it had a page. For an operation most schedules run that is a page's worth of rows; for a rare one it is
every schedule: 1.3 s a page, and 0.24 s more for the capped count, over a million schedules
(docs/PERFORMANCE.md, issue 29). This index holds the operation, then the list's order, so a page is a
range of it, and a rare operation's count reads its few entries.

Built CONCURRENTLY, outside a transaction, so the fleet's writes to `task_schedule` (every firing updates
its schedule) go on while it builds (2.4 s over a million schedules); an invalid index left by an
interrupted build is dropped and built again (`dialect.building_index_concurrently`), and a valid one built
beforehand is kept (IF NOT EXISTS). The expression is spelled as the filter renders it
(`store.tables.schedule_operation`), which PostgreSQL matches by its spelling. SQLite: nothing (the
embedded database of small fleets, whose list reads few rows whatever the filter).

A release before it, still serving during a rolling upgrade, neither reads nor writes it by name: its
firings' updates write entries into it as into every index.

Revision ID: 0051
Revises: 0050
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None

INDEX = "ix_task_schedule_operation_kind"
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
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="task_schedule", if_exists=True)
