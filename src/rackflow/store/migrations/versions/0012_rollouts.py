"""rollouts: a schedule's rollout policy; a run's rollout state, and at most one live rollout per schedule

* `task_schedule.rollout`: the schedule's RolloutPolicy as JSON (NULL: a firing starts every scope at once).
* `task_schedule_run`: `rollout` (the policy the run rolls out by), `reason` (why it halted or was
  skipped), `failures_excused` and `resumed` (what its last resume excused); its `state` may also be
  "rolling", "halted", "cancelled" or "skipped".
* `uq_task_schedule_run_live_rollout`: a unique index on task_schedule_run (schedule_id) where the state is
  rolling or halted: never two rollouts of one schedule at once. No run before this revision has either
  state, so no existing row can break it.
* `ix_task_schedule_run_rolling`: the rollout driver's scan reads only rolling runs.

SQLite cannot change a CHECK constraint in place, so the batch operation rebuilds `task_schedule_run`
there: dropping the old table fires `tasks.run_id`'s ON DELETE SET NULL, which would unlink every task from
its firing (and the lost-connection recovery looks a firing's tasks up by it). The links are kept aside in
a temporary table and put back after the rebuild, as 0006 did for the scopes' last tasks.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"

OLD_STATES = "state IN ('running', 'completed', 'interrupted')"
NEW_STATES = "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped')"
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
LIVE_WHERE = sa.text("state IN ('rolling', 'halted')")
ROLLING_WHERE = sa.text("state = 'rolling'")


def _rebuild_runs(check: str, add_columns: bool) -> None:
    rebuilds = op.get_bind().dialect.name == "sqlite"
    if rebuilds:
        op.execute(
            "CREATE TEMPORARY TABLE task_run_link AS SELECT id, run_id FROM tasks WHERE run_id IS NOT NULL"
        )
    with op.batch_alter_table("task_schedule_run", schema=None) as batch_op:
        if add_columns:
            batch_op.add_column(sa.Column("rollout", JSON, nullable=True))
            batch_op.add_column(sa.Column("reason", sa.Text(), server_default="", nullable=False))
            batch_op.add_column(
                sa.Column("failures_excused", sa.Integer(), server_default="0", nullable=False)
            )
            batch_op.add_column(
                sa.Column("resumed", sa.Boolean(), server_default=sa.text("false"), nullable=False)
            )
        batch_op.drop_constraint(op.f("ck_task_schedule_run_state"), type_="check")
        batch_op.create_check_constraint("state", sa.text(check))
        if not add_columns:
            for column in ("resumed", "failures_excused", "reason", "rollout"):
                batch_op.drop_column(column)
    if rebuilds:
        op.execute(
            "UPDATE tasks SET run_id = (SELECT kept.run_id FROM task_run_link AS kept WHERE kept.id = tasks.id) "
            "WHERE id IN (SELECT id FROM task_run_link)"
        )
        op.execute("DROP TABLE task_run_link")


def upgrade() -> None:
    op.add_column(
        "task_schedule",
        sa.Column("rollout", JSON, nullable=True),
    )
    _rebuild_runs(NEW_STATES, add_columns=True)
    op.create_index(
        "uq_task_schedule_run_live_rollout",
        "task_schedule_run",
        ["schedule_id"],
        unique=True,
        postgresql_where=LIVE_WHERE,
        sqlite_where=LIVE_WHERE,
    )
    op.create_index(
        "ix_task_schedule_run_rolling",
        "task_schedule_run",
        ["id"],
        postgresql_where=ROLLING_WHERE,
        sqlite_where=ROLLING_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_task_schedule_run_rolling", table_name="task_schedule_run")
    op.drop_index("uq_task_schedule_run_live_rollout", table_name="task_schedule_run")
    # A rollout's states do not exist before this revision: its runs end as the sweep would leave them.
    op.execute(
        "UPDATE task_schedule_run SET state = 'completed' WHERE state IN ('halted', 'cancelled', 'skipped')"
    )
    op.execute("UPDATE task_schedule_run SET state = 'interrupted' WHERE state = 'rolling'")
    _rebuild_runs(OLD_STATES, add_columns=False)
    op.drop_column("task_schedule", "rollout")
