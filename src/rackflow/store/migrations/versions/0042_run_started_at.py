"""runs: when an approved run started, so the stuck-run sweep counts its age from then

The sweep marks a run "interrupted" once it has been "running" longer than STUCK_RUN_AGE, and counted that
from `fired_at`. A run that awaited approval starts only when approved, perhaps hours after it fired: the
sweep of any instance interrupted it at once, while its approver's instance was still submitting its
tasks and writing it back. `started_at` is when it left "awaiting_approval" for "running" or "rolling"
(`store.runs.decide_awaiting`), and the sweep counts from it, or from `fired_at` for a run that
started as it fired (null: every other run, and every run this migration finds).

A nullable column without a default rewrites no row, on either database. A release before it, still
serving during a rolling upgrade, approves without it, so the run it approves is swept by its firing's age
as before.

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("task_schedule_run", sa.Column("started_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_schedule_run", "started_at")
