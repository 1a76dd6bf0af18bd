"""task_schedule.scope_removed_after, the stamp of a schedule's last scope removal, and a run's kept task
counts (issue 29)

The runs grid lists after a schedule's scope the racks of its shown runs that are no longer in it; finding
them read every task (or outcome) of the page's runs, 200,000 index entries for 20 runs of 10,000 racks
(docs/PERFORMANCE.md, "The runs grid: racks that left, skipped by a stamp"). A rack can only have left a
run's scope by a removal after the run took its racks, so every removal of a scope entry now stamps its
schedule in the removing transaction with the newest `fired_at` among its runs (`store.scope_removals`),
and the grid reads who left only for a page with a run fired at or before the stamp.

Existing schedules are stamped with one constant, the migration's time, or the newest `fired_at` of all
runs if later (a clock ahead fired it): a run that held a rack removed before the migration exists now, so
it fired at or before that constant, as the rule wants (`store.scope_removals`). Schedules created after
the migration start with none (NULL: no entry removed while they had runs).

Online on PostgreSQL: the column is added with that constant as its default, which PostgreSQL (11 and
later) keeps in the catalogue instead of rewriting the table, then the default is dropped; both hold the
table's ACCESS EXCLUSIVE lock for an instant (waited for at most `dialect.MIGRATION_LOCK_TIMEOUT`). On
SQLite the constant stays the column's default (dropping it would rebuild the table): the current
release writes NULL into each schedule it creates (`store.schedules.insert_schedule`), and a schedule
created with the default is stamped before its first run, which the rule makes no different from NULL.

Also `task_schedule_run.task_counts` and `tasks_deleted` (both nullable, no default: a catalogue change
on PostgreSQL): a run's tasks by status kept once they can no longer change, and whether a task of it was
deleted with its rack since; and the table `task_prune_horizon`, the cutoff the task prune last deleted
before (`store.kept_counts`), so the grid reads 20 small columns where it counted 200,000 index entries.
Existing runs have none kept; the grid keeps a run's count the first time it shows it final.

While the previous release still serves (a rolling upgrade, docs/OPERATIONS.md), a scope entry it removes
(or a rack it deletes) is not stamped: the runs grid of that schedule may then leave out the racks that
left with it, on pages of runs fired before that removal, until those runs leave the grid (the runs kept
and shown stay right; only the rows of racks outside the scope are missing). Likewise its task prune
raises no horizon and a rack it deletes marks no run: a count kept before stays, and the grid reads such a
run's cells from `tasks`, where the deleted ones are missing. docs/OPERATIONS.md says so.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-03
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime, json_type

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

TABLE = "task_schedule"
COLUMN = "scope_removed_after"
RUNS = "task_schedule_run"
HORIZON = "task_prune_horizon"


def upgrade() -> None:
    bind = op.get_bind()
    if COLUMN in {c["name"] for c in sa.inspect(bind).get_columns(TABLE)}:
        return  # a retry of this migration after it committed (PostgreSQL)
    stamp = _stamp(bind)
    op.add_column(TABLE, sa.Column(COLUMN, UTCDateTime(), nullable=True, server_default=stamp))
    if bind.dialect.name == "postgresql":
        op.alter_column(TABLE, COLUMN, server_default=None)
    op.add_column(RUNS, sa.Column("task_counts", json_type(), nullable=True))
    op.add_column(RUNS, sa.Column("tasks_deleted", sa.Boolean(), nullable=True))
    op.create_table(
        HORIZON,
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("pruned_before", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{HORIZON}"),
    )


def downgrade() -> None:
    op.drop_table(HORIZON)
    op.drop_column(RUNS, "tasks_deleted")
    op.drop_column(RUNS, "task_counts")
    op.drop_column(TABLE, COLUMN)


def _stamp(bind: sa.Connection) -> str:
    """The existing schedules' stamp, as a literal of the column's type on this database: now, or the
    newest run's `fired_at` if later (a clock behind the one that fired it)."""
    newest = bind.execute(sa.text("SELECT max(fired_at) FROM task_schedule_run")).scalar_one()
    if bind.dialect.name == "postgresql":
        now = bind.execute(sa.text("SELECT now()")).scalar_one()
        stamp = max(now, newest) if newest is not None else now
        return str(stamp.astimezone(UTC).isoformat())
    # SQLite: naive UTC text in SQLAlchemy's format, which compares as the values do.
    now_text = datetime.now(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    return max(now_text, str(newest)) if newest is not None else now_text
