"""window_decisions_owed: the tasks a window's change skipped, to be decided again even if its instance dies

A maintenance window's creation, edit or deletion decides again, in its transaction, the tasks bound to the
windows it changed, but skips a task whose row a claim holds, and decided it again only once it committed,
in the instance that made the change: one that died (or failed) in between left the task bound to the
window's old end (`rackflow.tasks.deferrals`). The change now records those tasks here, in its
transaction; whichever transaction decides one deletes its row, and every executor looks at this table at
its dead-hold cadence. A new, small table (one row per task owed, normally none), with no foreign key:
nothing existing is rewritten or locked, so the migration is online on both databases. A release before it,
still serving during a rolling upgrade, neither reads nor writes it (its window changes, and its
executors, behave as before: a change of one that dies after commit may still leave such a task bound to
the old end, found by a new instance's look).

Revision ID: 0048
Revises: 0047
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "window_decisions_owed",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("owed_since", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("task_id", name="pk_window_decisions_owed"),
    )


def downgrade() -> None:
    op.drop_table("window_decisions_owed")
