"""The dead-hold sweep is answered by the partial index `ix_tasks_held`, not by a scan of every ended task.

Both databases match a partial index's predicate by its spelling, and PostgreSQL cannot match it at all from
a parameter once it plans a prepared statement generically (psycopg prepares a statement after a few runs):
the index's predicate is the sweep's literal `owner_id IS NOT NULL` (migration 0005). These tests EXPLAIN
the statement the sweep really sends, over a history of ended tasks with fresh statistics, planned with its
parameter values and, on PostgreSQL, generically.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert

from rackflow.clock import SystemClock
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.store.tables import instances, metadata, racks, tasks
from tests.store.query_plans import explain, explain_generic

HELD_INDEX = "ix_tasks_held"
ENDED_TASKS = 5000
T0 = datetime(2026, 3, 1, tzinfo=UTC)


async def _add_history(db: Database) -> None:
    """Many ended tasks (no holder), a few running ones and one cancelled task a dead instance still holds."""
    live, dead = uuid.uuid4(), uuid.uuid4()
    rack_ids = [uuid.uuid4() for _ in range(50)]
    ended = ("completed", "failed", "terminated")
    rows = [
        {"status": ended[i % 3], "owner_id": None, "rack_id": rack_ids[i % len(rack_ids)]}
        for i in range(ENDED_TASKS)
    ]
    rows += [{"status": "running", "owner_id": live, "rack_id": rack_ids[i]} for i in range(3)]
    rows.append({"status": "terminated", "owner_id": dead, "rack_id": rack_ids[0]})
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await conn.execute(
            insert(instances),
            [
                {"id": live, "host": "h", "pid": 1, "started_at": now, "heartbeat_at": now},
                {"id": dead, "host": "h", "pid": 2, "started_at": T0, "heartbeat_at": T0},
            ],
        )
        await conn.execute(
            insert(racks), [{"id": r, "name": f"r{i}", "created_at": T0} for i, r in enumerate(rack_ids)]
        )
        base = {"operation": "power_on", "parameters": {}, "component_ids": [], "created_at": T0}
        await conn.execute(
            insert(tasks), [{**base, "id": uuid.uuid4(), "updated_at": T0, **row} for row in rows]
        )
        await conn.exec_driver_sql("ANALYZE tasks" if db.is_postgres else "ANALYZE")


@pytest.fixture
async def history(db: Database) -> Database:
    await _add_history(db)
    return db


@pytest.fixture
async def pg_history(postgres_url: str) -> AsyncIterator[Database]:
    """The history on PostgreSQL alone, in the session's database emptied first (as `db` does)."""
    database = Database(postgres_url)
    async with database.transaction() as conn:
        await conn.exec_driver_sql(f"TRUNCATE {', '.join(t.name for t in metadata.sorted_tables)} CASCADE")
    await _add_history(database)
    yield database
    await database.dispose()


async def _sweep_statement(db: Database) -> tuple[str, Any]:
    """The SELECT for dead holds that one sweep sends to the driver."""
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if (
            statement.startswith("SELECT")
            and "owner_id IS NOT NULL" in statement
            and "instances" in statement
        ):
            sent.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await Services.build(db, SystemClock()).tasks.sweep(lease_ttl=timedelta(seconds=30), dead_holds=True)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    assert len(sent) == 1, f"expected one dead-hold query, got {[s for s, _ in sent]}"
    return sent[0]


async def _held_indexes(db: Database) -> set[str]:
    """The held index's names: on PostgreSQL the partitioned index's and its partitions' (the tasks are
    partitioned by filing time, migration 0062: a plan names the partition's index it reads)."""
    if not db.is_postgres:
        return {HELD_INDEX}
    async with db.read() as conn:
        found = await conn.exec_driver_sql(f"SELECT relid::text FROM pg_partition_tree('{HELD_INDEX}')")
        return set(found.scalars())


async def test_the_sweep_reads_the_held_index(history: Database) -> None:
    plan = await explain(history, *await _sweep_statement(history))
    assert any(index in plan for index in await _held_indexes(history)), plan


@pytest.mark.postgres
async def test_the_sweep_reads_the_held_index_when_prepared_generically(pg_history: Database) -> None:
    plan = await explain_generic(pg_history, *await _sweep_statement(pg_history))
    assert any(index in plan for index in await _held_indexes(pg_history)), plan
