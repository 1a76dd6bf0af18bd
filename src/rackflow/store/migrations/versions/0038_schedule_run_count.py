"""schedules: how many runs each one has, so a firing under the run cap skips the cap's look (issue 29)

Each schedule keeps its newest RUNS_KEPT_PER_SCHEDULE runs (SPEC, "Run history"), and every firing looked
past them (`store.runs.prune_runs`) whatever the schedule's history held: a schedule with three runs
paid an index walk per firing to learn it had no 101st. That look was about a tenth of PostgreSQL's CPU a
firing on an empty database (docs/PERFORMANCE.md, "The run cap's look skipped under the cap").

`run_count` is how many runs the schedule has, as rackflow counts them: every firing's advance writes it
(saturating one past the cap), and the cap's look runs only for a schedule whose new run takes it past the
cap, or whose count is unknown. It is NULL, unknown, for every schedule this migration finds (counting ten
million runs here would hold the table while a drain goes on): each one's first firing after it counts its
runs once (`store.runs.cap_runs`). A schedule created from now on starts at 0. Adding a nullable
column without a default changes no row, on either database.

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("task_schedule", sa.Column("run_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_schedule", "run_count")
