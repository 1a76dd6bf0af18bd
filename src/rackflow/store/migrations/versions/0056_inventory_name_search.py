"""racks and nvl_domains: the name searches read trigram indexes (PostgreSQL)

ListRacks' `name_contains` (`rackflow rack list --name-contains`) and the schedule form's picker
(`/names/{racks|nvl_domains}`) are substring searches, `name ILIKE '%' || :text || '%'`, which the names'
unique B-trees cannot serve: PostgreSQL read every name when few matched, 0.1-0.3 s a search at 100,000
racks (docs/PERFORMANCE.md, "The schedule form's racks"). GIN indexes of the names' trigrams, as 0027's of
the schedules', answer a text of three characters or more. PostgreSQL only: SQLite has no trigram index
and keeps its scan.

The extension `pg_trgm` is 0027's, which a database at 0055 has (0027's index depends on it: PostgreSQL
refuses to drop it while the index exists), so creating it if missing is a no-op needing no privilege. Only
if it was dropped since (with CASCADE, taking 0027's index) must it be created again, and a role that may
not fails this migration as 0027 fails, naming the statement a superuser must run
(`dialect.creating_pg_trgm`), before any index is built.

Built CONCURRENTLY, outside a transaction, as 0055's (racks and domains may be created while they build);
an invalid index left by an interrupted build is dropped and built again
(`dialect.building_index_concurrently`), a valid one built beforehand kept (IF NOT EXISTS).

A release before it, still serving during a rolling upgrade, names neither index: what it writes is indexed
as in every index, and its searches (ILIKE for every length of text) may read them too.

Revision ID: 0056
Revises: 0055
Create Date: 2026-12-06
"""

from alembic import op

from rackflow.store.dialect import building_index_concurrently, creating_pg_trgm

revision = "0056"
down_revision = "0055"
branch_labels = None
depends_on = None

INDEXES = (("ix_racks_name_trgm", "racks"), ("ix_nvl_domains_name_trgm", "nvl_domains"))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    creating_pg_trgm(bind, revision)
    for index, table in INDEXES:
        with op.get_context().autocommit_block(), building_index_concurrently(bind, index):
            op.create_index(
                index,
                table,
                ["name"],
                postgresql_using="gin",
                postgresql_ops={"name": "gin_trgm_ops"},
                if_not_exists=True,
                postgresql_concurrently=True,
            )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index, table in INDEXES:
        op.drop_index(index, table_name=table, if_exists=True)
