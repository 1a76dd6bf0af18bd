"""notifications: every claim of a delivery numbered, never reset: the fence its result is written under

A claim of a delivery counts one more attempt, and its send's result was written only while that attempt
number was still the row's. But `rackflow notify redeliver` counts a dead delivery's attempts from zero
again, so the claims after it are given attempt numbers that claims before it had: a send from before
the redelivery that outlived its lease (a stalled instance) passed the fence, wrote its result over the
new claim's, and could make the delivery due again while the new claim was still sending it.

`claims` counts every claim of the delivery and is never reset; the result's write is fenced by it (and
by the attempt, as before, so a claim by an instance of the previous release, which counts only
attempts, still fences out the current release's older claims while both serve). Every delivery this
migration finds starts at 0. Adding a column with a constant default rewrites no row, on either database.

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "notification_delivery", sa.Column("claims", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("notification_delivery", "claims")
