"""a run's outcome counts, and its tasks by status from an index (issue 29)

The runs grid's column verdicts and a run's page need, per run, how many of its racks had each outcome
with a task or without (`store.schedules.Tally`) and how many of its tasks are in each status. Both were
counted per request from scratch: the 20 shown runs' outcome JSON unnested (at 10,000 racks, 23 MB of
jsonb from TOAST and 200,000 elements) and their 200,000 tasks read from the heap (docs/PERFORMANCE.md,
issue 29, "The runs grid and a big run's page"). Now:

* `task_schedule_run.outcome_counts` (JSON, `{"<outcome>": [racks without a task, racks with one]}`),
  written with the outcomes by every store function that writes them (`store.runs`,
  `store.rollouts`), so a run's tally is one small column of its row. Existing runs are counted here from
  their outcomes, in the database (PostgreSQL `jsonb_array_elements`, SQLite `json_each`).
* `ix_tasks_run_id_status` (run_id, status): a run's tasks by status, counted from the index alone
  (index-only on PostgreSQL, a covering index on SQLite), where the count read every task's heap row.
  A task's status changes often, so it is counted from an index kept by the database rather than kept in
  a row of its run that every one of 10,000 task completions would update (and lock).

On PostgreSQL this migration is applied online, under a running fleet (docs/OPERATIONS.md, "Migrations
applied online"; tests/faults/test_online_migration.py), outside a transaction (an autocommit block):

* the index is built CONCURRENTLY first (writes to `tasks` go on; an invalid index left by an interrupted
  build is dropped and built again, `dialect.building_index_concurrently`);
* the column is added (its constant default needs no rewrite of the table, so its ACCESS EXCLUSIVE lock
  is held for an instant, and waited for at most `dialect.MIGRATION_LOCK_TIMEOUT`);
* the existing runs are counted in chunks of BACKFILL_CHUNK runs by id, each chunk its own transaction, so
  a chunk locks its runs' rows only, for a moment, where one UPDATE of every run held them all (and the
  table, which the column's addition had locked in the same transaction) to the end.

Each step is safe to run again (IF NOT EXISTS; a chunk counts only runs not yet counted), so a migration
that gave up waiting for a lock and is tried again (`migrate.MIGRATION_RETRY`) goes on where it was. Runs
the previous release writes after the column exists, while the upgrade lasts, have no counts: the current
release counts those from their outcomes when it reads them (`store.runs.run_tallies`).

An earlier version of this migration did all three in one transaction (and built the index without
CONCURRENTLY); a database already past 0024 never runs it again, and both versions leave the same schema
(tests/store/test_migrations.py), so changing how it gets there changes nothing for such a database.
SQLite (one instance, no concurrent writer) still does it in the upgrade's one transaction.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

import uuid

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import building_index_concurrently
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


# Runs counted per transaction on PostgreSQL: a chunk's rows are locked for its own UPDATE only.
BACKFILL_CHUNK = 2_000
_LAST_OF_CHUNK = """
    SELECT id FROM (SELECT id FROM task_schedule_run WHERE id > :after ORDER BY id LIMIT :chunk) c
    ORDER BY id DESC LIMIT 1
"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.add_column(
            "task_schedule_run",
            sa.Column("outcome_counts", json_type(), nullable=False, server_default=sa.text("'{}'")),
        )
        op.execute(_BACKFILL[bind.dialect.name])
        op.create_index("ix_tasks_run_id_status", "tasks", ["run_id", "status"], if_not_exists=True)
        return
    with op.get_context().autocommit_block():
        with building_index_concurrently(bind, "ix_tasks_run_id_status"):
            op.create_index(
                "ix_tasks_run_id_status",
                "tasks",
                ["run_id", "status"],
                if_not_exists=True,
                postgresql_concurrently=True,
            )
        op.execute(
            "ALTER TABLE task_schedule_run ADD COLUMN IF NOT EXISTS outcome_counts jsonb NOT NULL DEFAULT '{}'"
        )
        after = uuid.UUID(int=0)
        while (
            last := bind.scalar(sa.text(_LAST_OF_CHUNK), {"after": after, "chunk": BACKFILL_CHUNK})
        ) is not None:
            bind.execute(
                sa.text(
                    f"{_BACKFILL['postgresql']} AND outcome_counts = '{{}}' AND id > :after AND id <= :last"
                ),
                {"after": after, "last": last},
            )
            after = last


def downgrade() -> None:
    op.drop_index("ix_tasks_run_id_status", table_name="tasks", if_exists=True)
    op.drop_column("task_schedule_run", "outcome_counts")
