"""notifications

* `notification_event`: the outbox, one row per event (written in the transaction of the change it
  reports), with the names of what it concerns; `fanned_out` once its deliveries are made.
* `notification_channel` (name unique): a webhook, Slack or Alertmanager, and its subscription.
* `notification_delivery`: one event to one channel (UNIQUE (event_id, channel_id)), pending, delivered
  or dead, with its attempts and when the next one is due.

New tables only: no existing table changes, so SQLite rebuilds nothing.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notification_event",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("schedule_id", sa.Uuid(), nullable=True),
        sa.Column("schedule_name", sa.String(length=255), server_default="", nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("rack_id", sa.Uuid(), nullable=True),
        sa.Column("rack_name", sa.String(length=255), server_default="", nullable=False),
        sa.Column("task_id", sa.Uuid(), nullable=True),
        sa.Column("operation", sa.String(length=32), server_default="", nullable=False),
        sa.Column("principal", sa.String(length=255), nullable=False),
        sa.Column("payload", JSON_TYPE, nullable=False),
        sa.Column("fanned_out", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.CheckConstraint(
            "severity IN ('info', 'warning', 'critical')", name="ck_notification_event_severity"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_notification_event"),
    )
    op.create_index(
        "ix_notification_event_new",
        "notification_event",
        ["at"],
        postgresql_where=sa.text("fanned_out IS false"),
        sqlite_where=sa.text("fanned_out IS 0"),
    )
    op.create_index("ix_notification_event_at_id", "notification_event", ["at", "id"])
    op.create_table(
        "notification_channel",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret", sa.Text(), server_default="", nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("event_types", JSON_TYPE, nullable=False),
        sa.Column("schedules", JSON_TYPE, nullable=False),
        sa.Column("operations", JSON_TYPE, nullable=False),
        sa.Column("min_severity", sa.String(length=16), nullable=False),
        sa.Column("rate_per_minute", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('webhook', 'slack', 'alertmanager')", name="ck_notification_channel_kind"
        ),
        sa.CheckConstraint("rate_per_minute >= 1", name="ck_notification_channel_rate_per_minute"),
        sa.CheckConstraint("max_attempts >= 1", name="ck_notification_channel_max_attempts"),
        sa.PrimaryKeyConstraint("id", name="pk_notification_channel"),
        sa.UniqueConstraint("name", name="uq_notification_channel_name"),
    )
    op.create_table(
        "notification_delivery",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("channel_id", sa.Uuid(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), server_default="", nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state IN ('pending', 'delivered', 'dead')", name="ck_notification_delivery_state"
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["notification_event.id"],
            name="fk_notification_delivery_event_id_notification_event",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["notification_channel.id"],
            name="fk_notification_delivery_channel_id_notification_channel",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_notification_delivery"),
        sa.UniqueConstraint("event_id", "channel_id", name="uq_notification_delivery_event_id_channel_id"),
    )
    op.create_index("ix_notification_delivery_event_id", "notification_delivery", ["event_id"])
    op.create_index(
        "ix_notification_delivery_due",
        "notification_delivery",
        ["channel_id", "next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_notification_delivery_state_created_at", "notification_delivery", ["state", "created_at"]
    )


def downgrade() -> None:
    op.drop_table("notification_delivery")
    op.drop_table("notification_channel")
    op.drop_table("notification_event")
