"""tasks: the index of a schedule's tasks carries their status (PostgreSQL), for a list filtered by both

ListTasks filtered by schedule and by status (`rackflow task list --schedule S --status failed`, the task
list page's filters) counts its matches up to 10,001 (`store.paging.count_capped`) and pages them newest
first. `ix_tasks_schedule_id_created_at_id` (migration 0022) holds a schedule's tasks in the list's order
but not their status, so each entry's status was read from the table: for a status most of the
schedule's tasks have, PostgreSQL judged a scan of the table cheaper, and the count of a 10,000-rack
schedule's completed tasks read every task (878 ms over ten million; docs/PERFORMANCE.md, issue 29).
`ix_tasks_schedule_id_created_at_id_status` holds the same entries in the same order with the status
beside them (INCLUDE): the count reads the index alone (2 ms), the page filters its entries before
reading a row. No firing writes an entry more (it replaces the old index), and a task's status update
was not HOT before either (the status is in three other indexes).

On PostgreSQL the new index is built CONCURRENTLY, then the old one dropped CONCURRENTLY, outside a
transaction, so the fleet's writes to `tasks` go on (19 s over ten million tasks); each step is safe to
run again (`dialect.replace_index_online`). On SQLite, which has no INCLUDE, the index is made again
under its new name with the same columns (plain statements; its fleets are small), as the downgrade's are
on both (it builds the old index in one transaction, as 0022 did).

A release before it, still serving during a rolling upgrade, names no index: its reads take the new one
as they took the old.

Revision ID: 0052
Revises: 0051
Create Date: 2026-12-05
"""

from alembic import op

from rackflow.store.dialect import replace_index_online

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None

OLD = "ix_tasks_schedule_id_created_at_id"
NEW = "ix_tasks_schedule_id_created_at_id_status"
COLUMNS = ["schedule_id", "created_at", "id"]


def upgrade() -> None:
    replace_index_online("tasks", OLD, NEW, COLUMNS, postgresql_include=["status"])


def downgrade() -> None:
    op.create_index(OLD, "tasks", COLUMNS)
    op.drop_index(NEW, table_name="tasks")
