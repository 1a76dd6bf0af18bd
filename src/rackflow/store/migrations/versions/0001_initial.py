"""initial schema: inventory, tasks, instances, schedules, runs

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    op.create_table(
        "nvl_domains",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nvl_domains")),
        sa.UniqueConstraint("name", name=op.f("uq_nvl_domains_name")),
    )
    op.create_table(
        "task_schedule",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("spec_type", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.String(length=256), nullable=False),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column(
            "operation_template", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("overlap_policy", sa.String(length=8), server_default="skip", nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "overlap_policy IN ('skip', 'queue')", name=op.f("ck_task_schedule_overlap_policy")
        ),
        sa.CheckConstraint(
            "spec_type IN ('interval', 'cron', 'one-time')", name=op.f("ck_task_schedule_spec_type")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_schedule")),
        sa.UniqueConstraint("name", name=op.f("uq_task_schedule_name")),
    )
    with op.batch_alter_table("task_schedule", schema=None) as batch_op:
        batch_op.create_index("ix_task_schedule_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index(
            "ix_task_schedule_due",
            ["next_run_at"],
            unique=False,
            postgresql_where=sa.text("enabled AND next_run_at IS NOT NULL"),
            sqlite_where=sa.text("enabled AND next_run_at IS NOT NULL"),
        )

    op.create_table(
        "racks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("external_id", sa.String(length=255), nullable=True),
        sa.Column("nvl_domain_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["nvl_domain_id"],
            ["nvl_domains.id"],
            name=op.f("fk_racks_nvl_domain_id_nvl_domains"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_racks")),
        sa.UniqueConstraint("external_id", name=op.f("uq_racks_external_id")),
        sa.UniqueConstraint("name", name=op.f("uq_racks_name")),
    )
    op.create_table(
        "task_schedule_run",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("schedule_id", sa.Uuid(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("outcomes", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("owner_id", sa.Uuid(), nullable=True),
        sa.CheckConstraint(
            "state IN ('running', 'completed', 'interrupted')", name=op.f("ck_task_schedule_run_state")
        ),
        sa.CheckConstraint("trigger IN ('dispatch', 'manual')", name=op.f("ck_task_schedule_run_trigger")),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["task_schedule.id"],
            name=op.f("fk_task_schedule_run_schedule_id_task_schedule"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_schedule_run")),
    )
    with op.batch_alter_table("task_schedule_run", schema=None) as batch_op:
        batch_op.create_index(
            "ix_task_schedule_run_running",
            ["owner_id"],
            unique=False,
            postgresql_where=sa.text("state = 'running'"),
            sqlite_where=sa.text("state = 'running'"),
        )
        batch_op.create_index(
            "ix_task_schedule_run_schedule_id_fired_at", ["schedule_id", "fired_at"], unique=False
        )

    op.create_table(
        "components",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("rack_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("external_id", sa.String(length=255), nullable=True),
        sa.Column("firmware_version", sa.String(length=255), server_default="", nullable=False),
        sa.Column("power_state", sa.String(length=16), server_default="unknown", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rack_id"], ["racks.id"], name=op.f("fk_components_rack_id_racks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_components")),
        sa.UniqueConstraint("type", "external_id", name=op.f("uq_components_type_external_id")),
    )
    with op.batch_alter_table("components", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_components_rack_id"), ["rack_id"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("operation", sa.String(length=32), nullable=False),
        sa.Column("parameters", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("rack_id", sa.Uuid(), nullable=False),
        sa.Column("component_ids", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), server_default="", nullable=False),
        sa.Column("queue_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schedule_id", sa.Uuid(), nullable=True),
        sa.Column("owner_id", sa.Uuid(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'terminated', 'waiting')",
            name=op.f("ck_tasks_status"),
        ),
        sa.ForeignKeyConstraint(
            ["rack_id"], ["racks.id"], name=op.f("fk_tasks_rack_id_racks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(
            "ix_tasks_active",
            ["status", "created_at"],
            unique=False,
            postgresql_where=sa.text("status IN ('pending', 'running', 'waiting')"),
            sqlite_where=sa.text("status IN ('pending', 'running', 'waiting')"),
        )
        batch_op.create_index("ix_tasks_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_tasks_rack_id_status", ["rack_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_schedule_id"), ["schedule_id"], unique=False)

    op.create_table(
        "task_schedule_scope",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("schedule_id", sa.Uuid(), nullable=False),
        sa.Column("rack_id", sa.Uuid(), nullable=False),
        sa.Column(
            "component_filter", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True
        ),
        sa.Column("last_task_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["last_task_id"],
            ["tasks.id"],
            name=op.f("fk_task_schedule_scope_last_task_id_tasks"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["rack_id"], ["racks.id"], name=op.f("fk_task_schedule_scope_rack_id_racks"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["task_schedule.id"],
            name=op.f("fk_task_schedule_scope_schedule_id_task_schedule"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_schedule_scope")),
        sa.UniqueConstraint(
            "schedule_id", "rack_id", name=op.f("uq_task_schedule_scope_schedule_id_rack_id")
        ),
    )
    with op.batch_alter_table("task_schedule_scope", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_schedule_scope_rack_id"), ["rack_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("task_schedule_scope", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_schedule_scope_rack_id"))

    op.drop_table("task_schedule_scope")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_schedule_id"))
        batch_op.drop_index("ix_tasks_rack_id_status")
        batch_op.drop_index("ix_tasks_created_at")
        batch_op.drop_index(
            "ix_tasks_active",
            postgresql_where=sa.text("status IN ('pending', 'running', 'waiting')"),
            sqlite_where=sa.text("status IN ('pending', 'running', 'waiting')"),
        )

    op.drop_table("tasks")
    with op.batch_alter_table("components", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_components_rack_id"))

    op.drop_table("components")
    with op.batch_alter_table("task_schedule_run", schema=None) as batch_op:
        batch_op.drop_index("ix_task_schedule_run_schedule_id_fired_at")
        batch_op.drop_index(
            "ix_task_schedule_run_running",
            postgresql_where=sa.text("state = 'running'"),
            sqlite_where=sa.text("state = 'running'"),
        )

    op.drop_table("task_schedule_run")
    op.drop_table("racks")
    with op.batch_alter_table("task_schedule", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_task_schedule_due",
            postgresql_where=sa.text("enabled AND next_run_at IS NOT NULL"),
            sqlite_where=sa.text("enabled AND next_run_at IS NOT NULL"),
        )
        batch_op.drop_index("ix_task_schedule_created_at_id")

    op.drop_table("task_schedule")
    op.drop_table("nvl_domains")
    op.drop_table("instances")
