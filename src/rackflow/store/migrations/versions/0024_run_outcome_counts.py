"""a run's outcome counts, and its tasks by status from an index (issue 29)

The runs grid's column verdicts and a run's page need, per run, how many of its racks had each outcome
with a task or without (`store.schedules.Tally`) and how many of its tasks are in each status. Both were
counted per request from scratch: the 20 shown runs' outcome JSON unnested (at 10,000 racks, 23 MB of
jsonb from TOAST and 200,000 elements) and their 200,000 tasks read from the heap (docs/PERFORMANCE.md,
issue 29, "The runs grid and a big run's page"). Now:

* `task_schedule_run.outcome_counts` (JSON, `{"<outcome>": [racks without a task, racks with one]}`),
  written with the outcomes by every store function that writes them (`store.schedules`,
  `store.rollouts`), so a run's tally is one small column of its row. Existing runs are counted here from
  their outcomes, in the database (PostgreSQL `jsonb_array_elements`, SQLite `json_each`).
* `ix_tasks_run_id_status` (run_id, status): a run's tasks by status, counted from the index alone
  (index-only on PostgreSQL, a covering index on SQLite), where the count read every task's heap row.
  A task's status changes often, so it is counted from an index kept by the database rather than kept in
  a row of its run that every one of 10,000 task completions would update (and lock).

The index is created IF NOT EXISTS, so that on a large PostgreSQL database an operator can build it
first with `CREATE INDEX CONCURRENTLY ix_tasks_run_id_status ON tasks (run_id, status)` (writes go on);
otherwise it blocks writes to `tasks` while it builds. The backfill rewrites every run row once.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import json_type

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# Each run's outcomes counted by (outcome, has a task), as `store.schedules.outcome_counts_to_json` counts
# them: a task id that is JSON null or absent is no task.
_BACKFILL = {
    "postgresql": """
        UPDATE task_schedule_run SET outcome_counts = coalesce((
            SELECT jsonb_object_agg(kind, jsonb_build_array(untasked, tasked))
            FROM (SELECT o->>'outcome' AS kind,
                         count(*) FILTER (WHERE o->>'task_id' IS NULL) AS untasked,
                         count(*) FILTER (WHERE o->>'task_id' IS NOT NULL) AS tasked
                  FROM jsonb_array_elements(task_schedule_run.outcomes) o GROUP BY 1) per_outcome
        ), '{}'::jsonb)
        WHERE jsonb_array_length(outcomes) > 0
    """,
    "sqlite": """
        UPDATE task_schedule_run SET outcome_counts = coalesce((
            SELECT json_group_object(kind, json_array(untasked, tasked))
            FROM (SELECT json_extract(o.value, '$.outcome') AS kind,
                         sum(json_extract(o.value, '$.task_id') IS NULL) AS untasked,
                         sum(json_extract(o.value, '$.task_id') IS NOT NULL) AS tasked
                  FROM json_each(task_schedule_run.outcomes) o GROUP BY 1) per_outcome
        ), '{}')
        WHERE json_array_length(outcomes) > 0
    """,
}


def upgrade() -> None:
    op.add_column(
        "task_schedule_run",
        sa.Column("outcome_counts", json_type(), nullable=False, server_default=sa.text("'{}'")),
    )
    op.execute(_BACKFILL[op.get_bind().dialect.name])
    op.create_index("ix_tasks_run_id_status", "tasks", ["run_id", "status"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_tasks_run_id_status", table_name="tasks", if_exists=True)
    op.drop_column("task_schedule_run", "outcome_counts")
