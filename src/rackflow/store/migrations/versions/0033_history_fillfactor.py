"""tasks, task_schedule_run: pages filled to 90 %, so a firing's new rows append to the newest pages (issue 29)

A run or task is inserted small and rewritten larger within seconds (outcomes, a message), and the rewrite
is never a HOT update, so the full pages of the history keep a gap that a new row fits and a rewritten one
does not. Vacuum records those gaps in the free space map, and PostgreSQL placed each new run and task of a
firing in one of them: a random old page read from the disk, dirtied and logged whole, for every run and
every task. Among ten million of each that was 2.3 of a loaded firing's 2.3 blocks read from outside
`shared_buffers`; with the pages filled to 90 %, 0.4–0.5 (docs/PERFORMANCE.md, "Inserts into the gaps of
old pages"). A page is then given to an insert only while a tenth of it would stay free, so inserts append
to the newest pages, and a row's own rewrite finds room on its page.

PostgreSQL only (SQLite has no such setting). `ALTER TABLE … SET (fillfactor)` takes a SHARE UPDATE
EXCLUSIVE lock, which reads and writes do not wait for, and rewrites nothing: it applies to pages filled
from now on (the runner's 0.5 s lock wait applies, behind a running VACUUM of the table).

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-04
"""

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

TABLES = ("tasks", "task_schedule_run")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} SET (fillfactor = 90)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
