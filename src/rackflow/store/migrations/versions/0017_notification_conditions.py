"""notification conditions and shared channel rates

* `notification_event.dedupe_key`: an event that a loop finds (rather than a write site records) carries a
  key naming what it reports, unique, so two instances that find the same thing write one event (a task
  held too long: the task, its gate and since when; `rackflow.notify.holds`).
* `notification_event.cleared_at`: when the condition a keyed event raised was cleared (its clearing
  event written). The clearing is written only by the transaction that sets it (`… WHERE cleared_at IS
  NULL`), so once; an open condition's event is not pruned.
* `notification_channel.rate_tokens`, `rate_at`: the channel's token bucket, shared by every instance
  (`rackflow.notify.delivery`): a claim takes from it under the row's lock. NULL: full.

Only columns and indexes are added (`ALTER TABLE … ADD COLUMN` on both databases), so SQLite rebuilds no
table.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("notification_event", sa.Column("dedupe_key", sa.String(length=255), nullable=True))
    op.add_column("notification_event", sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("uq_notification_event_dedupe_key", "notification_event", ["dedupe_key"], unique=True)
    op.create_index(
        "ix_notification_event_open",
        "notification_event",
        ["type"],
        postgresql_where=sa.text("dedupe_key IS NOT NULL AND cleared_at IS NULL"),
        sqlite_where=sa.text("dedupe_key IS NOT NULL AND cleared_at IS NULL"),
    )
    op.add_column("notification_channel", sa.Column("rate_tokens", sa.Float(), nullable=True))
    op.add_column("notification_channel", sa.Column("rate_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_index("ix_notification_event_open", "notification_event")
    op.drop_index("uq_notification_event_dedupe_key", "notification_event")
    if op.get_bind().dialect.name == "postgresql":
        op.drop_column("notification_channel", "rate_at")
        op.drop_column("notification_channel", "rate_tokens")
        op.drop_column("notification_event", "cleared_at")
        op.drop_column("notification_event", "dedupe_key")
    # SQLite keeps the columns (unused by 0016): dropping them means rebuilding the tables.
