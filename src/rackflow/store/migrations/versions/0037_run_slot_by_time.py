"""runs: the slot's unique index led by the slot's time, so a firing's run goes to its right edge (issue 29)

`uq_task_schedule_run_slot` (migration 0006) holds once per tick: one dispatched run per (schedule, slot).
It was led by the schedule, so each run a firing inserts went to the schedule's place in an index of every
dispatched run ever kept: among a million schedules and ten million runs, one random leaf a firing, read
from the disk when not cached and logged whole at its first change after a checkpoint. Nothing reads the
index by schedule (the runs of a schedule are read by `ix_task_schedule_run_schedule_id_fired_at`); it is
only ever probed by the insert that checks the slot. Led by `scheduled_for` instead, the same pairs are
unique, and the slots a drain fires (all due about now) go to the index's newest leaves, which stay cached.

On PostgreSQL the new index is built CONCURRENTLY (it reads every dispatched run: seconds to a minute over
ten million; writes go on, and until it is valid the old index still refuses a second run of a slot)
before the old one is dropped CONCURRENTLY; an interrupted build is dropped and built again
(`dialect.replace_index_online`). On SQLite both are plain statements, as the downgrade's are on
both.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import replace_index_online

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

TABLE = "task_schedule_run"
BY_SCHEDULE = "uq_task_schedule_run_slot"
BY_TIME = "uq_task_schedule_run_slot_by_time"
DISPATCHED = sa.text("scheduled_for IS NOT NULL")


def upgrade() -> None:
    replace_index_online(
        TABLE, BY_SCHEDULE, BY_TIME, ["scheduled_for", "schedule_id"], where=DISPATCHED, unique=True
    )


def downgrade() -> None:
    op.create_index(
        BY_SCHEDULE,
        TABLE,
        ["schedule_id", "scheduled_for"],
        unique=True,
        postgresql_where=DISPATCHED,
        sqlite_where=DISPATCHED,
    )
    op.drop_index(BY_TIME, table_name=TABLE)
