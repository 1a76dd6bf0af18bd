"""racks: the rack list and a domain's racks read in their order from an index (issue 29)

ListRacks and the dashboard's rack list take racks oldest first (`RACK_ORDER`: creation time, id), a
page at a time, but no index held that order: PostgreSQL read every rack and sorted them for each page,
the first and every next one (20,000 racks at full size: 207 buffers and a top-N sort a page, growing with
the fleet; docs/PERFORMANCE.md, "At full size at the eleventh stop"). The racks of one NVLink domain
(ListRacks filtered by domain, a window's or rollout's domains resolved to their racks, a domain budget's
queue held back, and the foreign key's SET NULL when a domain is deleted) were found by reading every rack.

`ix_racks_created_at_id` is the list's order; `ix_racks_nvl_domain_id_created_at_id` is a domain's racks in
that order. Racks are written seldom (an inventory change), so the two entries a new rack writes cost
nothing a firing pays. On PostgreSQL each is built CONCURRENTLY, so inventory writes go on while it builds,
and an invalid index left by an interrupted build is built again (`dialect.building_index_concurrently`).

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-04
"""

from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_racks_created_at_id", ["created_at", "id"]),
    ("ix_racks_nvl_domain_id_created_at_id", ["nvl_domain_id", "created_at", "id"]),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for name, columns in INDEXES:
            op.create_index(name, "racks", columns, if_not_exists=True)
        return
    with op.get_context().autocommit_block():
        for name, columns in INDEXES:
            with building_index_concurrently(bind, name):
                op.create_index(name, "racks", columns, postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    for name, _ in INDEXES:
        op.drop_index(name, table_name="racks", if_exists=True)
