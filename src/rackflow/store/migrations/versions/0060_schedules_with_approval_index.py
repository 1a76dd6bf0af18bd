"""task_schedule: the schedules with an approval policy read from an index of their own

A server that can count its approvers (every one but a server under mutual TLS without tokens) looks, before
it listens, at every schedule with an approval policy, to name those its approvers could never approve
(`ScheduleService.name_unapprovable`, `store.schedules.approval_set_ups`). A schedule without a policy stores
JSON's null, which `IS NOT NULL` keeps, so the look read every schedule in name order, policy or not: 120,791
buffers and 344-386 ms of PostgreSQL's time at each start over a million schedules, none with a policy
(docs/PERFORMANCE.md, "The promotion check's look at a rack's waiting tasks, and the start-up look at the
approval policies"). This index holds the schedules with a policy alone, by name, so the look reads those. A
firing of a schedule without a policy writes no entry here.

On PostgreSQL built CONCURRENTLY, outside a transaction, as 0053's (the fleet's writes go on while it
builds; an invalid index left by an interrupted build is dropped and built again, and a valid one built
beforehand kept); on SQLite a plain CREATE INDEX. The predicate is spelled as the look's filter renders,
which both databases match by its spelling.

A release before it, still serving during a rolling upgrade, neither reads nor writes it by name: a
policy it sets or removes writes or removes the schedule's entry as in every index.

Revision ID: 0060
Revises: 0059
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import building_index_concurrently

revision = "0060"
down_revision = "0059"
branch_labels = None
depends_on = None

INDEX = "ix_task_schedule_approval_name"
HAS_POLICY = sa.text("approval IS NOT NULL AND CAST(approval AS TEXT) <> 'null'")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.create_index(INDEX, "task_schedule", ["name"], sqlite_where=HAS_POLICY)
        return
    with op.get_context().autocommit_block(), building_index_concurrently(bind, INDEX):
        op.create_index(
            INDEX,
            "task_schedule",
            ["name"],
            postgresql_where=HAS_POLICY,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="task_schedule", if_exists=True)
