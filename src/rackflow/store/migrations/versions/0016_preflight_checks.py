"""pre-flight checks

* `preflight_checks` (name unique): what must hold on a rack before a task of its operations starts there
  (`kind` and its `settings`), re-checked every `interval`, for at most `max_wait`.
* `preflight_tasks`: a task the pre-flight gate holds (rounds done, the next one's time, a checker's
  lease, an operator's override); `preflight_results`: what each round found, by check. Both go with
  their task (ON DELETE CASCADE).

New tables only: no existing table changes, so SQLite rebuilds nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime, json_type

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "preflight_checks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("operations", json_type(), nullable=False),
        sa.Column("all_racks", sa.Boolean(), nullable=False),
        sa.Column("rack_ids", json_type(), nullable=False),
        sa.Column("domain_ids", json_type(), nullable=False),
        sa.Column("settings", json_type(), nullable=False),
        sa.Column("interval", sa.String(length=64), nullable=False),
        sa.Column("max_wait", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_preflight_checks"),
        sa.UniqueConstraint("name", name="uq_preflight_checks_name"),
    )
    op.create_table(
        "preflight_tasks",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("next_check_at", UTCDateTime(), nullable=True),
        sa.Column("checking_until", UTCDateTime(), nullable=True),
        sa.Column("override_reason", sa.Text(), nullable=True),
        sa.Column("overridden_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_preflight_tasks_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", name="pk_preflight_tasks"),
    )
    op.create_table(
        "preflight_results",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("check_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("check_name", sa.String(length=255), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("checked_at", UTCDateTime(), nullable=False),
        sa.Column("recheck_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_preflight_results_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", "check_id", "attempt", name="pk_preflight_results"),
    )


def downgrade() -> None:
    op.drop_table("preflight_results")
    op.drop_table("preflight_tasks")
    op.drop_table("preflight_checks")
