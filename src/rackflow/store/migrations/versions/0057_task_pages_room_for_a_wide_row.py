"""tasks: pages filled to 70 %, so a wide task's progress rewrite stays on its page (issue 29)

A task is rewritten once a step (its progress message). On a GB200 NVL72 rack it names 36 components, a
row of about 1.75 KB, and the tenth of a page that migration 0033 kept free (0.8 KB) holds no new version
of it: every rewrite went to another page, a new entry in each of the table's eleven indexes, 2.5 KB of WAL
a step and 101 KB a task. With pages filled to 70 % the rewrite is a HOT update on the row's own page: 18 KB
of WAL a task, measured by `bench/capacity.py --components 36` (docs/CAPACITY.md, "Racks of 36
components"). Inserts still append to the newest pages (they need the new row's size and the 30 % free).

PostgreSQL only (SQLite has no such setting). `ALTER TABLE … SET (fillfactor)` takes a SHARE UPDATE
EXCLUSIVE lock, which reads and writes do not wait for, and rewrites nothing: it applies to pages filled
from now on, so the history's pages stay as they are (the runner's 0.5 s lock wait applies, behind a
running VACUUM of the table).

Revision ID: 0057
Revises: 0056
Create Date: 2026-12-06
"""

from alembic import op

revision = "0057"
down_revision = "0056"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE tasks SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE tasks SET (fillfactor = 90)")
