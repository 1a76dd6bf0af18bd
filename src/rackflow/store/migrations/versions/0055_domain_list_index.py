"""nvl_domains: the domain list's order is an index, so a page of ListNVLDomains is a range of it

ListNVLDomains had no pages: it answered every domain with its racks. A fleet of NVL72 racks has a domain
a rack, and 20,000 of them were 2 MB and half a second an answer, past gRPC's 4 MiB at about 40,000, and
every command or page that named one domain read them all (docs/PERFORMANCE.md, "NVLink domains at a
fleet's size"). Its pages are keyset ranges of (created_at, id), the list's order, as the racks' are
(0032).

Built CONCURRENTLY on PostgreSQL, outside a transaction, as 0054's (domains may be created while it
builds); an invalid index left by an interrupted build is dropped and built again
(`dialect.building_index_concurrently`), a valid one built beforehand kept (IF NOT EXISTS). SQLite builds
it in place.

A release before it, still serving during a rolling upgrade, reads it by no name; what it writes is
indexed as in every index.

Revision ID: 0055
Revises: 0054
Create Date: 2026-12-06
"""

from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0055"
down_revision = "0054"
branch_labels = None
depends_on = None

INDEX = "ix_nvl_domains_created_at_id"
TABLE = "nvl_domains"
COLUMNS = ["created_at", "id"]


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.create_index(INDEX, TABLE, COLUMNS, if_not_exists=True)
        return
    with op.get_context().autocommit_block(), building_index_concurrently(bind, INDEX):
        op.create_index(INDEX, TABLE, COLUMNS, postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name=TABLE, if_exists=True)
