"""notification_event and notification_delivery: the look for Alertmanager re-sends reads two indexes

Every instance with an enabled Alertmanager channel looks every 15 s for the alerts due to be sent again
(`store.outbox.next_resend`, `claim_resends`): the deliveries of the raises whose condition is still open,
and the clearings delivered in the last few intervals that owe one more resolved alert. It read every event
of the retention's week to find the raises not marked cleared, and every delivery to find the clearings:
50 ms a look at 50,000 events a week, growing with the week (docs/PERFORMANCE.md, "The look for
re-sends"). `ix_notification_event_type_cleared_at` makes the first a range of the condition types'
uncleared entries, `ix_notification_delivery_channel_id_delivered_at` the second a range of the channel's
last few intervals.

Built CONCURRENTLY on PostgreSQL, outside a transaction, as 0051's (deliveries and events go on being
written while it builds); an invalid index left by an interrupted build is dropped and built again
(`dialect.building_index_concurrently`), a valid one built beforehand kept (IF NOT EXISTS). SQLite builds
them in place (its tables are a deployment's own, and small).

A release before it, still serving during a rolling upgrade, reads neither by name; what it writes is
indexed as in every index.

Revision ID: 0054
Revises: 0053
Create Date: 2026-12-06
"""

from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0054"
down_revision = "0053"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_notification_event_type_cleared_at", "notification_event", ["type", "cleared_at"]),
    (
        "ix_notification_delivery_channel_id_delivered_at",
        "notification_delivery",
        ["channel_id", "delivered_at"],
    ),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for index, table, columns in INDEXES:
            op.create_index(index, table, columns, if_not_exists=True)
        return
    for index, table, columns in INDEXES:
        with op.get_context().autocommit_block(), building_index_concurrently(bind, index):
            op.create_index(index, table, columns, postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    for index, table, _ in INDEXES:
        op.drop_index(index, table_name=table, if_exists=True)
