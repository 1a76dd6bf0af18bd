"""task_step_state: what a step recorded before it acted, kept across a takeover

A redfish reset is not idempotent: a task taken over from a dead instance repeated the restart its
predecessor had already sent, restarting the machine twice. The step now records, before it sends the
Reset, the power and `LastResetTime` it read, and the run that takes the task over reads them back to tell
whether the restart happened (docs/REDFISH.md). One row per task, attempt and component, going with its
task (ON DELETE CASCADE). A new table: nothing existing is rewritten, and a release before it, still
serving during a rolling upgrade, neither reads nor writes it (its takeovers repeat restarts, as before).

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import json_type

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_step_state",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("component_id", sa.Uuid(), nullable=False),
        sa.Column("recorded", json_type(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_task_step_state_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", "attempt", "component_id", name="pk_task_step_state"),
    )


def downgrade() -> None:
    op.drop_table("task_step_state")
