"""audit: what an action changed that its request does not name

DeleteRack and RemoveComponent take entries out of schedules' scopes (or narrow their component filters),
but their events named only the rack or component: an operator reading a schedule's history never saw
that a rack left its scope, nor who caused it. Their events now name those schedules in `target_ids`
and say what happened to each scope entry in `changes` (rackflow/audit/changes.py); null for every other
event, and for every event this migration finds.

A nullable column without a default rewrites no row, on either database; on PostgreSQL the partitions
of `audit_events` (migration 0028) take it from their parent. A release before it, still serving during
a rolling upgrade, names its columns when it inserts, so its events are written with no changes.

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import json_type

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_events", sa.Column("changes", json_type(), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_events", "changes")
