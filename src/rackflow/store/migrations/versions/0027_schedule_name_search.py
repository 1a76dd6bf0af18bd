"""task_schedule: the name search reads a trigram index (issue 29)

ListTaskSchedules' `name_contains` (and the dashboard's `/schedules?search=`) is a substring search,
`name ILIKE '%' || :text || '%'`, which no B-tree serves: PostgreSQL read every name, 3 s at a million
schedules (docs/PERFORMANCE.md, "Sorted by next or last run, and the name search"). A GIN index of the
names' trigrams (`pg_trgm`) answers a text of three characters or more from the index. Shorter texts
have no trigram to look up; PostgreSQL plans them as before. PostgreSQL only: SQLite has no trigram index
and keeps its scan (one instance, an embedded database).

The extension is created if missing (`dialect.creating_pg_trgm`). PostgreSQL 13 and later mark `pg_trgm`
trusted, so a role with CREATE on the database may create it; a role that may not (or an older server)
fails this migration with the statement a superuser must run before anything of it is done: the
migrations before it stay applied (on PostgreSQL each commits on its own), 0027's own transaction is
rolled back, and `rackflow db migrate` run again goes on from it.

The index is built CONCURRENTLY, outside a transaction (an autocommit block), so the fleet's writes to
`task_schedule` (every firing moves a schedule's next run) go on while it builds; an invalid index left by
an interrupted build is dropped and built again (`dialect.building_index_concurrently`). An index of that
name built beforehand, valid, is kept (IF NOT EXISTS).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-03
"""

from alembic import op

from rackflow.store.dialect import building_index_concurrently, creating_pg_trgm

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    creating_pg_trgm(bind, revision)
    with op.get_context().autocommit_block(), building_index_concurrently(bind, "ix_task_schedule_name_trgm"):
        op.create_index(
            "ix_task_schedule_name_trgm",
            "task_schedule",
            ["name"],
            postgresql_using="gin",
            postgresql_ops={"name": "gin_trgm_ops"},
            if_not_exists=True,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_task_schedule_name_trgm", table_name="task_schedule", if_exists=True)
