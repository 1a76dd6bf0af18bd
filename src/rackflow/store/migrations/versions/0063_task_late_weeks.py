"""task_late_weeks: each week holding a task created after the week ended, and the latest such creation, so
a newest-first page of tasks reads the newest weeks alone (PostgreSQL)

A list of tasks is newest first by creation time, and PostgreSQL plans each of its reads over every week
of tasks kept (migration 0062): at a year of weeks the list of a schedule's tasks of every status, six
reads merged, planned for 86 ms and ran for 17 (docs/PERFORMANCE.md, "A page of tasks from the newest
weeks"). A page of the newest tasks needs only the weeks their creation times are in, but a task is filed
in the week of its run's slot, not of its creation: a rollout's later wave, a run that waited for an
approval or a window, a retry, each is created after its week may have ended. This table says where those
are: a row per week (the Monday its filing time is in, as the partitions' bounds are) that holds a task
created at or after the week's end, with the latest such creation (`store.task_partitions.created_since`).

Kept by a trigger, so every writer keeps it, in the writer's own transaction: each release's code, a
rolling upgrade's older release (which knows nothing of it), an operator's SQL. The trigger runs only for
such a task (its WHEN is evaluated in the insert, no function called for a task created in its week), and
takes the week's row until commit: late tasks of one week are written one transaction at a time. It is
cloned to every partition, those attached later included.

The rows the migration finds are written in its transaction, after the trigger exists and under its lock
(SHARE ROW EXCLUSIVE on `tasks`, which its writes wait for, briefly, and its reads do not): for each week,
the latest creation at or after the week's end, read from the week's creation-time index; for the
partition before the weeks, whose rows were filed long ago, its latest creation, as one row of the week of
long ago. A week dropped by the retention loses its row. SQLite has the table, empty: its tasks are not
partitioned.

Revision ID: 0063
Revises: 0062
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.task_partitions import PARENT, find_late_weeks
from rackflow.store.types import UTCDateTime

revision = "0063"
down_revision = "0062"
branch_labels = None
depends_on = None

TABLE = "task_late_weeks"
TRIGGER = "task_created_late"  # PostgreSQL's function, and the trigger on `tasks`
WEEK = "interval '7 days'"
WEEK_OF_FILING = "date_trunc('week', NEW.filed_at, 'UTC')"
RECORD = (
    f"INSERT INTO {TABLE} (week, last_created_at) VALUES ({WEEK_OF_FILING}, NEW.created_at)"
    f" ON CONFLICT (week) DO UPDATE SET last_created_at = excluded.last_created_at"
    f" WHERE {TABLE}.last_created_at < excluded.last_created_at"
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("week", UTCDateTime, nullable=False),
        sa.Column("last_created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("week", name=f"pk_{TABLE}"),
    )
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    op.execute(
        f"CREATE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {RECORD}; RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON {PARENT} FOR EACH ROW"
        f" WHEN (NEW.created_at >= {WEEK_OF_FILING} + {WEEK}) EXECUTE FUNCTION {TRIGGER}()"
    )
    find_late_weeks(conn)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {PARENT}")
        op.execute(f"DROP FUNCTION IF EXISTS {TRIGGER}()")
    op.drop_table(TABLE)
