"""tasks: `run_id` without its foreign key on PostgreSQL, so neither a task's insert nor a run's deletion
visits the other table (issue 29)

`tasks.run_id` named its run by a foreign key ON DELETE SET NULL (migration 0006). On PostgreSQL that key
cost twice: every task inserted checked its run and locked the run's row (`FOR KEY SHARE`), and every run
deleted (by `--run-retention`, or with its schedule) looked its tasks up and rewrote each, every index
entry included, to unlink it (docs/PERFORMANCE.md, "The prune at ten million rows": 13.8 KB of WAL a run).
It is also what stands between the run table and partitions of its own (docs/PERFORMANCE.md, "History
that stays cheap"): a key into a partitioned table forbids dropping a partition its rows still name.

What the key held is kept where it is read: a task's run is looked up by id (the run's page, a firing's
recovery by `uq_tasks_run_id_rack_id`), and a pruned run's id, like a pruned run's `retry_of`, names no run:
a reader finds none, as it found NULL before. SQLite keeps the key (`ddl_if`): there the key costs little,
no partition waits on it, and dropping it would rebuild `tasks`, whose rebuild under SQLite's enforced keys
would delete the pre-flight rows that refer to it.

PostgreSQL: the key is dropped (a brief lock on both tables; the runner's 0.5 s lock wait applies). The
downgrade forgets the run ids that name no run, then puts the key back (NOT VALID first, then validated, so
writes go on while it scans).

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-04
"""

from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

FOREIGN_KEY = "fk_tasks_run_id_task_schedule_run"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE tasks DROP CONSTRAINT IF EXISTS {FOREIGN_KEY}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "UPDATE tasks SET run_id = NULL WHERE run_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM task_schedule_run AS run WHERE run.id = tasks.run_id)"
    )
    op.execute(
        f"ALTER TABLE tasks ADD CONSTRAINT {FOREIGN_KEY} FOREIGN KEY (run_id) "
        "REFERENCES task_schedule_run (id) ON DELETE SET NULL NOT VALID"
    )
    op.execute(f"ALTER TABLE tasks VALIDATE CONSTRAINT {FOREIGN_KEY}")
