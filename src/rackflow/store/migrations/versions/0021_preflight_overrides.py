"""pre-flight overrides of single checks

* `preflight_overrides`: one check an operator overrode for one task (`OverridePreflightChecks` with
  `checks`); it goes with its task (ON DELETE CASCADE). The override of every check of a task stays on
  `preflight_tasks`.

A new table only: no existing table changes, so SQLite rebuilds nothing.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "preflight_overrides",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("check_id", sa.Uuid(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("overridden_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_preflight_overrides_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", "check_id", name="pk_preflight_overrides"),
    )


def downgrade() -> None:
    op.drop_table("preflight_overrides")
