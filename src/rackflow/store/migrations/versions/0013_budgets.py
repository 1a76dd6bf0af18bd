"""operation budgets

* `operation_budgets` (name unique): at most `max_running` tasks of `operations` running at once across
  the fleet, and at most `max_running_per_domain` (NULL: no such cap) in one NVLink domain; both at least
  1, held by CHECKs.

A new table only: no existing table changes, so SQLite rebuilds nothing.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operation_budgets",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("operations", JSON_TYPE, nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=False),
        sa.Column("max_running_per_domain", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("max_running >= 1", name="ck_operation_budgets_max_running"),
        sa.CheckConstraint(
            "max_running_per_domain IS NULL OR max_running_per_domain >= 1",
            name="ck_operation_budgets_max_running_per_domain",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_operation_budgets"),
        sa.UniqueConstraint("name", name="uq_operation_budgets_name"),
    )


def downgrade() -> None:
    op.drop_table("operation_budgets")
