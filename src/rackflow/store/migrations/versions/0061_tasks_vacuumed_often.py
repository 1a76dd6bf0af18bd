"""tasks: autovacuum every 10,000 dead rows and one per cent, its indexes always cleaned (PostgreSQL)

The executor's claim walks the live tasks in the queue's order (`ix_tasks_live_queue`) and stops once it
has its tasks. Every task that ended left its entries in that index dead, and a walk reads their pages
(it skips an entry a walk marked dead without reading its row, but not its page), so each claim read
every page of the tasks ended since `tasks` was last vacuumed. Only VACUUM empties those pages: no insert
lands on the pages of tasks that all ended. Autovacuum's defaults wait for a fifth of the table to change
(two million rows at ten million tasks), and then, with dead rows on fewer than 2 % of its pages, may leave
the indexes alone (INDEX_CLEANUP auto). Measured at full size (docs/PERFORMANCE.md, "The live queue's dead
entries vacuumed"): a claim 10-13 ms with 541,483 dead rows, 0.48 ms after a VACUUM, growing by about
0.6 ms with every 30,000; a VACUUM (INDEX_CLEANUP ON) of the ten million tasks took 1.31 s. So `tasks` is
vacuumed once 10,000 rows and one per cent of it are dead (116,000 at ten million tasks, 11,000 at
100,000), with its indexes cleaned every time (`vacuum_index_cleanup`), and a claim reads at most those.

`ALTER TABLE … SET (…)` takes a SHARE UPDATE EXCLUSIVE lock, which reads and writes do not wait for, and
rewrites nothing (the runner's 0.5 s lock wait applies, behind a running VACUUM of the table). An operator
may set other values (`ALTER TABLE tasks SET (…)`); no other migration sets them. SQLite has no
such settings. A release before it, still serving during a rolling upgrade, is unaffected.

Revision ID: 0061
Revises: 0060
Create Date: 2026-12-07
"""

from alembic import op

revision = "0061"
down_revision = "0060"
branch_labels = None
depends_on = None

SETTINGS = {
    "vacuum_index_cleanup": "on",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "10000",
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE tasks SET ({', '.join(f'{k} = {v}' for k, v in SETTINGS.items())})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE tasks RESET ({', '.join(SETTINGS)})")
