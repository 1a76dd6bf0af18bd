"""window_decisions_owed: what made each decision owed

A task a window's change skipped (a claim held its row), or a firing's submit inserted once the windows had
changed under it, is recorded owed a decision (migration 0048); when an executor's look again makes it, its
audit event (`RedecideWindowTask`, by rackflow) named the task, its run and rack, but not what made it owed:
an operator reading a rack's history found a task ended by rackflow and had to guess which edit caused it.
Each row now keeps its cause in `cause` (JSON: the window's change, its window, the audited call's event
and principal; or the windows a firing's submit found changed since its claim, `rackflow.audit.decisions`),
which the decision's event names.

A nullable column without a default on a small table (one row per task owed, normally none) rewrites no
row, on either database; on PostgreSQL its ACCESS EXCLUSIVE lock is held an instant, under the migration
runner's lock timeout and retries. A release before it, still serving during a rolling upgrade, names its
columns when it inserts, so its rows have no cause (NULL), which this release reads as "not recorded";
it reads only `task_id`, so the new column is nothing to it.

Revision ID: 0050
Revises: 0049
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import json_type

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("window_decisions_owed", sa.Column("cause", json_type(), nullable=True))


def downgrade() -> None:
    op.drop_column("window_decisions_owed", "cause")
