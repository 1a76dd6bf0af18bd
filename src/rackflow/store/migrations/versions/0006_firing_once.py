"""runs: one per dispatched slot; tasks: the run that submitted them, one per rack

Exactly-once firing was held by the dispatcher's code path alone (a claimed row is advanced in the same
transaction). Two constraints now hold it in the database, for every code path to come:

* `uq_task_schedule_run_slot`: a unique index on task_schedule_run (schedule_id, scheduled_for) where
  scheduled_for is set, so one dispatched tick can never be recorded twice. Manual runs (no slot) are not
  limited. The dispatcher records increasing slots per schedule, but a clock set back on SQLite (whose
  "now" is the host's) and a resume could have recorded one slot twice: the later run of such a pair keeps
  its row and outcomes and loses its slot (scheduled_for NULL), which only ever served the lag metric.
* `tasks.run_id`: the firing that submitted a task (nullable: direct submissions and tasks older than this
  revision have none; ON DELETE SET NULL, so pruning run history keeps the tasks), with the unique index
  `uq_tasks_run_id_rack_id`: one task per rack per firing. The lost-connection recovery looks a firing's
  tasks up by it instead of by their description.

SQLite cannot add a foreign key to a table, so the batch operation rebuilds `tasks` there: it copies the
rows to a new table and drops the old one, and dropping it fires `task_schedule_scope.last_task_id`'s ON
DELETE SET NULL, which would make every SKIP schedule forget its last task (and fire over it). The scopes'
last tasks are kept aside in a temporary table and put back after the rebuild.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

SLOT_WHERE = sa.text("scheduled_for IS NOT NULL")

_UNSLOT_REPEATS = """
UPDATE task_schedule_run SET scheduled_for = NULL
WHERE scheduled_for IS NOT NULL AND EXISTS (
    SELECT 1 FROM task_schedule_run AS earlier
    WHERE earlier.schedule_id = task_schedule_run.schedule_id
      AND earlier.scheduled_for = task_schedule_run.scheduled_for
      AND (earlier.fired_at < task_schedule_run.fired_at
           OR (earlier.fired_at = task_schedule_run.fired_at AND earlier.id < task_schedule_run.id)))
"""


def upgrade() -> None:
    op.execute(_UNSLOT_REPEATS)
    op.create_index(
        "uq_task_schedule_run_slot",
        "task_schedule_run",
        ["schedule_id", "scheduled_for"],
        unique=True,
        postgresql_where=SLOT_WHERE,
        sqlite_where=SLOT_WHERE,
    )
    rebuilds = op.get_bind().dialect.name == "sqlite"
    if rebuilds:
        op.execute(
            "CREATE TEMPORARY TABLE scope_last_task AS "
            "SELECT id, last_task_id FROM task_schedule_scope WHERE last_task_id IS NOT NULL"
        )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("run_id", sa.Uuid(), nullable=True))
        batch_op.create_foreign_key(
            "fk_tasks_run_id_task_schedule_run", "task_schedule_run", ["run_id"], ["id"], ondelete="SET NULL"
        )
    if rebuilds:
        op.execute(
            "UPDATE task_schedule_scope SET last_task_id = "
            "(SELECT kept.last_task_id FROM scope_last_task AS kept WHERE kept.id = task_schedule_scope.id) "
            "WHERE id IN (SELECT id FROM scope_last_task)"
        )
        op.execute("DROP TABLE scope_last_task")
    op.create_index("uq_tasks_run_id_rack_id", "tasks", ["run_id", "rack_id"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_tasks_run_id_rack_id", table_name="tasks")
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("fk_tasks_run_id_task_schedule_run", "tasks", type_="foreignkey")
        op.drop_column("tasks", "run_id")
    # SQLite keeps the column (unused by 0005): dropping it means another rebuild of `tasks`.
    op.drop_index(
        "uq_task_schedule_run_slot",
        table_name="task_schedule_run",
        postgresql_where=SLOT_WHERE,
        sqlite_where=SLOT_WHERE,
    )
