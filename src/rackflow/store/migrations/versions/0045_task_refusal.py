"""tasks: a start gate's refusal, recorded by the claim that consulted the gates

A start gate that refuses a task (the pre-flight checks gate past a check's maximum wait, the rollout gate
for a cancelled rollout) leaves it RUNNING, for the executor that claimed it to end after the claim
committed. Should that instance die first, another takes the task over, and a takeover is not gated (it
began): it ran the task the gate had refused. `tasks.refusal` ({"reason", "ends_as"}) is written by the
claim in its transaction (`store.task_runs.record_refusals`), and a takeover ends the task with it
instead (`rackflow.tasks.gates.consult`).

A nullable column without a default rewrites no row, on either database (SQLite adds it in place). A
release before it, still serving during a rolling upgrade, neither writes nor reads it: a task its gates
refuse is not recorded so, and its takeovers run a refused task as before.

Revision ID: 0045
Revises: 0044
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import json_type

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("refusal", json_type(), nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "refusal")
