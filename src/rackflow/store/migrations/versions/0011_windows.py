"""maintenance windows; tasks a freeze holds back; a schedule's window policy

* `maintenance_windows` (name unique; recurring or one-off, held by a CHECK) and the racks and NVLink
  domains each covers (`maintenance_window_racks`, `maintenance_window_domains`: deleting a rack or a
  domain removes it from its windows).
* `tasks.not_before`: a FREEZE window held the task back until then (the claim leaves it until that
  time); `tasks.ignore_windows`: submitted with the override, so freezes do not hold it.
* `task_schedule.window_policy`: "skip" (what every schedule did so far) or "defer".

Only columns are added to existing tables (`ALTER TABLE … ADD COLUMN` on both databases), so SQLite
rebuilds no table and no `ON DELETE` action fires.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("cron", sa.String(length=256), nullable=True),
        sa.Column("duration", sa.String(length=64), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=True),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("all_racks", sa.Boolean(), nullable=False),
        sa.Column("operations", JSON_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('allow', 'freeze')", name="ck_maintenance_windows_kind"),
        sa.CheckConstraint(
            "(cron IS NOT NULL AND duration IS NOT NULL AND timezone IS NOT NULL"
            " AND start_at IS NULL AND end_at IS NULL)"
            " OR (cron IS NULL AND duration IS NULL AND timezone IS NULL"
            " AND start_at IS NOT NULL AND end_at IS NOT NULL AND end_at > start_at)",
            name="ck_maintenance_windows_when",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_maintenance_windows"),
        sa.UniqueConstraint("name", name="uq_maintenance_windows_name"),
    )
    for table, column, referred in (
        ("maintenance_window_racks", "rack_id", "racks"),
        ("maintenance_window_domains", "domain_id", "nvl_domains"),
    ):
        op.create_table(
            table,
            sa.Column("window_id", sa.Uuid(), nullable=False),
            sa.Column(column, sa.Uuid(), nullable=False),
            sa.ForeignKeyConstraint(
                ["window_id"],
                ["maintenance_windows.id"],
                name=f"fk_{table}_window_id_maintenance_windows",
                ondelete="CASCADE",
            ),
            sa.ForeignKeyConstraint(
                [column], [f"{referred}.id"], name=f"fk_{table}_{column}_{referred}", ondelete="CASCADE"
            ),
            sa.PrimaryKeyConstraint("window_id", column, name=f"pk_{table}"),
        )
        op.create_index(f"ix_{table}_{column}", table, [column])
    op.add_column("tasks", sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tasks", sa.Column("ignore_windows", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.add_column(
        "task_schedule",
        sa.Column("window_policy", sa.String(length=8), server_default="skip", nullable=False),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_column("task_schedule", "window_policy")
        op.drop_column("tasks", "ignore_windows")
        op.drop_column("tasks", "not_before")
    # SQLite keeps the columns (unused by 0010): dropping them means rebuilding `tasks` and `task_schedule`.
    for table, column in (
        ("maintenance_window_domains", "domain_id"),
        ("maintenance_window_racks", "rack_id"),
    ):
        op.drop_index(f"ix_{table}_{column}", table_name=table)
        op.drop_table(table)
    op.drop_table("maintenance_windows")
