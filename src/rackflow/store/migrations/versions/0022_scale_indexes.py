"""tasks and audit events: indexes in the order their lists read them (issue 29)

At ten million tasks and a million audit events, a filtered list read its filter's index and then sorted
every matching row, or walked the whole table in the list's order to find fifty that match (the EXPLAINs
are in docs/PERFORMANCE.md, issue 29). Each index below is the filter, then the list's order:

* `ix_tasks_schedule_id_created_at_id` (schedule_id, created_at, id), in place of `ix_tasks_schedule_id`:
  a schedule's tasks, newest first (ListTasks by schedule; a schedule of 10,000 racks has 500,000);
* `ix_tasks_status_created_at_id` (status, created_at, id): tasks in a status, newest first (ListTasks
  `statuses`, the dashboard's status filter), and their capped count;
* `ix_audit_events_principal_at_id`, `ix_audit_events_method_at_id`: the audit trail by principal or by
  method, newest first, and their capped count;
* `ix_task_schedule_paused` (name) WHERE enabled IS false: the paused schedules (the overview's list by
  name, the "paused" filter and its count), which the filter alone found by reading every schedule.

Only indexes: no row changes, nothing rebuilt. Each is created IF NOT EXISTS, so that on a large
PostgreSQL database an operator can build them first without blocking writes (`CREATE INDEX CONCURRENTLY
<name> ON …` with the columns above, docs/OPERATIONS.md) and this migration then only drops the index it
replaces; otherwise each CREATE INDEX blocks writes to its table while it builds (measured in
docs/PERFORMANCE.md, issue 29).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_tasks_schedule_id_created_at_id", "tasks", ["schedule_id", "created_at", "id"]),
    ("ix_tasks_status_created_at_id", "tasks", ["status", "created_at", "id"]),
    ("ix_audit_events_principal_at_id", "audit_events", ["principal", "at", "id"]),
    ("ix_audit_events_method_at_id", "audit_events", ["method", "at", "id"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, if_not_exists=True)
    op.create_index(
        "ix_task_schedule_paused",
        "task_schedule",
        ["name"],
        postgresql_where=sa.text("enabled IS false"),
        sqlite_where=sa.text("enabled IS 0"),
        if_not_exists=True,
    )
    op.drop_index("ix_tasks_schedule_id", table_name="tasks", if_exists=True)


def downgrade() -> None:
    op.create_index("ix_tasks_schedule_id", "tasks", ["schedule_id"], if_not_exists=True)
    op.drop_index("ix_task_schedule_paused", table_name="task_schedule", if_exists=True)
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table, if_exists=True)
