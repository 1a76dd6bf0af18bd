"""A database's tasks as migration 0062 leaves them weeks after it ran (PostgreSQL), for the tests and the
benchmarks (`bench/_common.tasks_partitioned_since`): where the migration made its weeks from BOUND on, a
database that old has weeks behind it too."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

from rackflow.store import task_partitions
from rackflow.store.audit_partitions import PERIOD, bound_literal


def weeks_made_earlier(conn: Connection, weeks: int) -> datetime:
    """In the caller's transaction: the bound of the partitions before the weeks (`tasks_before` and its
    five children's `…_before`) moved back `weeks` weeks, and the six partitions of each of those weeks
    made (`task_partitions.make_weeks`), so tasks filed since go to their weeks, as rackflow files them.
    The partitions before must hold nothing filed at or after the new bound (ATTACH checks them). The CHECK
    `tasks_filed_by_id` keeps the migration's BOUND: it still refuses a task filed LONG_AGO only for a run
    of that week or later. Returns the new bound."""
    first = task_partitions.first_week(conn)
    assert first is not None, "the tasks are not partitioned here"
    bound = first - weeks * PERIOD
    for table in (task_partitions.PARENT, *(child.name for child in task_partitions.CHILDREN)):
        before = f"{table}{task_partitions.BEFORE_SUFFIX}"
        conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {before}"))
        conn.execute(
            text(
                f"ALTER TABLE {table} ATTACH PARTITION {before}"
                f" FOR VALUES FROM (MINVALUE) TO ({bound_literal(bound)})"
            )
        )
    task_partitions.make_weeks(conn, [bound + k * PERIOD for k in range(weeks)])
    return bound
