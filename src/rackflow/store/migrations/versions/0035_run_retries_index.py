"""runs: only retries in the index on `retry_of`, so a firing writes no entry for its NULL (issue 29)

`retry_of` names the run that RetryTaskScheduleRun re-ran; all other runs hold NULL, and the index on it
(migration 0020) held an entry for every one: written when a firing inserts its run, and again when the
firing completes it (that update changes `state`, which partial indexes name, so it is never HOT), two
index writes a firing for a lookup that only ever asks for retries (`store.rollouts.retried_by`,
`retry_of IN (…)`, which both databases match to the predicate `retry_of IS NOT NULL`). The new index
holds only the retries.

On PostgreSQL the new index is built CONCURRENTLY (it reads the whole table: seconds over ten million runs;
writes go on) before the old one is dropped CONCURRENTLY, so a lookup always has one; an interrupted build
is dropped and built again (`dialect.replace_index_online`). On SQLite both are plain statements,
as the downgrade's are on both (it builds the index on every run in one transaction, as 0020 did).

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

from rackflow.store.dialect import replace_index_online

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

TABLE = "task_schedule_run"
EVERY_RUN = "ix_task_schedule_run_retry_of"
RETRIES = "ix_task_schedule_run_retries"
ONLY_RETRIES = sa.text("retry_of IS NOT NULL")


def upgrade() -> None:
    replace_index_online(TABLE, EVERY_RUN, RETRIES, ["retry_of"], where=ONLY_RETRIES)


def downgrade() -> None:
    op.create_index(EVERY_RUN, TABLE, ["retry_of"])
    op.drop_index(RETRIES, table_name=TABLE)
