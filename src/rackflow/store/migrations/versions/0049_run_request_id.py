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

Online on PostgreSQL: on a connection of its own, in autocommit (as 0046's step 1), the column is added
(nullable, no default: a change of the catalog, no row rewritten, under a brief ACCESS EXCLUSIVE lock) and
the index built CONCURRENTLY (reads and writes go on; an invalid index a failed build left is dropped
first). If the side connection cannot take its lock within SIDE_LOCK_TIMEOUT (an earlier migration of the
same run holds the runs), or the table was made by this very run, the migration does both itself, in its
transaction (then the build blocks writes of the runs for its duration; on a new database it is empty). A
release before this one, still serving during a rolling upgrade, neither reads nor writes the column: its
triggers carry no request id, as before.

Revision ID: 0049
Revises: 0048
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None

TABLE = "task_schedule_run"
DEFAULT = "task_schedule_run_default"
INDEX = "uq_task_schedule_run_default_request_id"
SQLITE_INDEX = "uq_task_schedule_run_request_id"
SIDE_LOCK_TIMEOUT = "5s"
ADD_COLUMN = f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS request_id VARCHAR(64)"
DEFINITION = f"ON {DEFAULT} (schedule_id, request_id) WHERE request_id IS NOT NULL"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        op.add_column(TABLE, sa.Column("request_id", sa.String(64), nullable=True))
        op.create_index(
            SQLITE_INDEX,
            TABLE,
            ["schedule_id", "request_id"],
            unique=True,
            sqlite_where=sa.text("request_id IS NOT NULL"),
        )
        return
    if _online(conn):
        return
    conn.execute(text(ADD_COLUMN))
    if _index_state(conn) is False:
        conn.execute(text(f"DROP INDEX {INDEX}"))
    conn.execute(text(f"CREATE UNIQUE INDEX IF NOT EXISTS {INDEX} {DEFINITION}"))


def _online(conn: Connection) -> bool:
    """Both steps on a connection of its own, in autocommit; False when it could not (see the docstring)."""
    side = conn.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        side.execute(text(f"SET lock_timeout = '{SIDE_LOCK_TIMEOUT}'"))
        if side.execute(text(f"SELECT to_regclass('{DEFAULT}') IS NULL")).scalar_one():
            return False  # made by this very migration run, not yet committed
        side.execute(text(ADD_COLUMN))
        if _index_state(side) is False:
            side.execute(text(f"DROP INDEX CONCURRENTLY {INDEX}"))  # left invalid by a failed build
        side.execute(text(f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} {DEFINITION}"))
    except DBAPIError:
        return False
    finally:
        side.close()
    return True


def _index_state(conn: Connection) -> bool | None:
    """Whether the index is valid; None when there is none."""
    query = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)")
    valid: bool | None = conn.execute(query, {"i": INDEX}).scalar()
    return valid


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        op.drop_index(SQLITE_INDEX, TABLE)
    op.drop_column(TABLE, "request_id")  # drops the partition's index with it
