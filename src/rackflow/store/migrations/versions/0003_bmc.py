"""components: BMC endpoint (Redfish service root, resource, credentials reference)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("components", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bmc_url", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("bmc_resource", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("bmc_credentials", sa.String(length=1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("components", schema=None) as batch_op:
        batch_op.drop_column("bmc_credentials")
        batch_op.drop_column("bmc_resource")
        batch_op.drop_column("bmc_url")
