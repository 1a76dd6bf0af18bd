"""schedules: the earliest slot of their runs in the runs' time partitions, so the run cap's look opens only
the partitions that can hold them

On PostgreSQL the runs are partitioned by their slot (migration 0046, `store.run_partitions`), and the run
cap's look for a schedule's oldest runs (`store.runs.prune_runs`), ordered by `fired_at`, opened every
partition, about 30 µs each per schedule looked at. `runs_since` is a slot no later than any of the
schedule's runs with a slot: the look reads only the partitions from there on, and the DEFAULT one for the
runs without a slot. A firing lowers it to its slot if that is earlier (it never is: a schedule's slots
advance); the cap's look raises it to the newest slot it deleted, as no run it keeps has an earlier one (a
schedule's runs fire in the order of their slots; one it may not delete, still open, holds it down).

NULL (every schedule this migration finds, and a new one until its first look): not known, so the look
opens every partition, once; it then sets it. A nullable column without a default rewrites no row, on either
database; the release before it, during a rolling upgrade, neither reads nor writes it, and its looks open
every partition as before.

Revision ID: 0047
Revises: 0046
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("task_schedule", sa.Column("runs_since", UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_schedule", "runs_since")
