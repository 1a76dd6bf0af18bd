"""runs: the request id of the manual trigger or retry that fired them, unique per schedule

A client's trigger (or retry) may carry a request id (docs/SCHEDULES.md): a second call with the id of a run
of the same schedule answers that run instead of firing again. The run records it in `request_id`
(nullable: a dispatched run, and a manual one without an id, have none), and the database holds "once per
request id" with a unique index of (schedule_id, request_id) over the runs that have one.

PostgreSQL: the runs are partitioned by their slot (`scheduled_for`, migration 0046, `store.run_partitions`),
and a unique index of the partitioned table must hold the partition key, which this one must not (two runs
of one request id with different slots would both be allowed). It need not: only a manual run has a request
id, and a manual run never has a slot (`firing.claim`: a manual firing's `scheduled_for` is NULL, and no
statement sets a run's slot afterwards), so every run with a request id is in the DEFAULT partition
`task_schedule_run_default`, the one partition that holds NULL slots. The unique index is that partition's,
`uq_task_schedule_run_default_request_id`, partial (WHERE request_id IS NOT NULL), so it is as small as the
runs with an id. SQLite: the same partial unique index on the table.

Online on PostgreSQL: the column is added in the migration's transaction (nullable, no default: a change
of the catalog, no row rewritten, its ACCESS EXCLUSIVE lock held an instant, under the migration runner's
lock timeout and retries), which an autocommit block then commits; the index is built CONCURRENTLY on the
partition (reads and writes go on; an invalid one an interrupted build left is dropped and built again,
`dialect.building_index_concurrently`), as 0044 builds its partitions' indexes. Each step is safe to run
again. A release before this one, still serving during a rolling upgrade, neither reads nor writes the
column: its triggers carry no request id, as before.

Revision ID: 0049
Revises: 0048
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from rackflow.store.dialect import building_index_concurrently

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None

TABLE = "task_schedule_run"
DEFAULT = "task_schedule_run_default"
INDEX = "uq_task_schedule_run_default_request_id"
SQLITE_INDEX = "uq_task_schedule_run_request_id"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.add_column(TABLE, sa.Column("request_id", sa.String(64), nullable=True))
        op.create_index(
            SQLITE_INDEX,
            TABLE,
            ["schedule_id", "request_id"],
            unique=True,
            sqlite_where=sa.text("request_id IS NOT NULL"),
        )
        return
    # IF NOT EXISTS: a try the build stopped has committed the column already.
    bind.execute(text(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS request_id VARCHAR(64)"))
    with op.get_context().autocommit_block(), building_index_concurrently(bind, INDEX):
        bind.execute(
            text(
                f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {INDEX}"
                f" ON {DEFAULT} (schedule_id, request_id) WHERE request_id IS NOT NULL"
            )
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(SQLITE_INDEX, TABLE)
    op.drop_column(TABLE, "request_id")  # on PostgreSQL, the partition's index with it
