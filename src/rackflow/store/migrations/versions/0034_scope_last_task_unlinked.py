"""scopes: `last_task_id` without its foreign key and index, so a firing's write-back is a HOT update (issue 29)

Every firing rewrites its scopes' `last_task_id`. With a foreign key to `tasks` and an index on the column
(migration 0010, for the key's ON DELETE SET NULL), that rewrite changed an indexed column, so PostgreSQL
wrote a new entry into each of the scope table's four indexes and checked the key against `tasks`: the
write-back was a fifth of PostgreSQL's time a firing in a drain, and at full size three of its entries went
to random leaves of million-entry indexes (docs/PERFORMANCE.md, "The write-back as a HOT update").
Without them the rewrite touches only the row's page, and the task prune no longer looks up, for each task
it deletes, the scopes that name it.

What the key held is kept where it is read: a scope's last task is looked up by id by the SKIP check
(`store.schedules.overlapping_scope_ids`), which finds none for a pruned task, as it found NULL before.
A pruned task's id stays in its scope, as `retry_of` keeps a pruned run's: it is still the task the
scope's newest firing submitted. A deleted rack takes its scopes along (their own key to `racks`).

PostgreSQL: the key is dropped (a brief lock on both tables; the runner's 0.5 s lock wait applies), and
the index CONCURRENTLY, so firings go on meanwhile. SQLite cannot drop a foreign key, so the batch
operation rebuilds `task_schedule_scope` (copies its rows; no other table refers to it). The downgrade
forgets the ids of tasks no longer there, then puts the key and index back.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-04
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

TABLE = "task_schedule_scope"
FOREIGN_KEY = "fk_task_schedule_scope_last_task_id_tasks"
INDEX = "ix_task_schedule_scope_last_task_id"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(INDEX, table_name=TABLE, if_exists=True)
        with op.batch_alter_table(TABLE, schema=None) as batch_op:
            batch_op.drop_constraint(FOREIGN_KEY, type_="foreignkey")
        return
    op.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {FOREIGN_KEY}")
    op.execute(f"ALTER TABLE {TABLE} SET (fillfactor = 90)")
    with op.get_context().autocommit_block():
        op.drop_index(INDEX, table_name=TABLE, postgresql_concurrently=True, if_exists=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {TABLE} RESET (fillfactor)")
    op.execute(
        f"UPDATE {TABLE} SET last_task_id = NULL WHERE last_task_id IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.id = {TABLE}.last_task_id)"
    )
    op.create_index(INDEX, TABLE, ["last_task_id"])
    with op.batch_alter_table(TABLE, schema=None) as batch_op:
        batch_op.create_foreign_key(FOREIGN_KEY, "tasks", ["last_task_id"], ["id"], ondelete="SET NULL")
