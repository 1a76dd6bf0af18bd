"""tasks: the index of a schedule's tasks keyed by their status, for a rare status's count and page

ListTasks filtered by schedule and status (`rackflow task list --schedule S --status failed`, the task
list page's filters) counts its matches up to 10,001 (`store.paging.count_capped`) and pages them newest
first. `ix_tasks_schedule_id_created_at_id_status` (migration 0052) holds a schedule's tasks in the list's
order with their status beside each entry, not in its key: a status few of a large schedule's tasks have
was counted by reading every entry of the schedule (about 350,000 for 10,001 failed tasks of the
10,000-rack schedule at full size: 102-123 ms p95; docs/PERFORMANCE.md, issue 29), and its page walked
them until it had its 50. `ix_tasks_schedule_id_status_created_at_id` puts the status before the list's
order: one status is a range of its own entries, and the list of several statuses, or of every status,
merges the newest of each (`store.tasks.list_tasks`), as the list by status alone already did. Its
entries are the ones the index it replaces held, so no firing writes one more, and a task's status update
moved an entry of the old index as it moves one of this.

On PostgreSQL the new index is built CONCURRENTLY, then the old one dropped CONCURRENTLY, outside a
transaction, so the fleet's writes to `tasks` go on; each step is safe to run again
(`dialect.replace_index_online`). On SQLite, plain statements (its fleets are small); the downgrade
builds the old index in one transaction on both, as 0052's does.

A release before it, still serving during a rolling upgrade, names no index: its reads of a schedule's
tasks take the new one by schedule and status (a range of each status, sorted) where they took the old one.

Revision ID: 0058
Revises: 0057
Create Date: 2026-12-06
"""

from alembic import op

from rackflow.store.dialect import replace_index_online

revision = "0058"
down_revision = "0057"
branch_labels = None
depends_on = None

OLD = "ix_tasks_schedule_id_created_at_id_status"
NEW = "ix_tasks_schedule_id_status_created_at_id"


def upgrade() -> None:
    replace_index_online("tasks", OLD, NEW, ["schedule_id", "status", "created_at", "id"])


def downgrade() -> None:
    op.create_index(OLD, "tasks", ["schedule_id", "created_at", "id"], postgresql_include=["status"])
    op.drop_index(NEW, table_name="tasks")
