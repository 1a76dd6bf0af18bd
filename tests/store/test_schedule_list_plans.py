"""The schedule list by next or last run reads its index (migration 0025), first page and next, in either
direction: one ORDER BY with NULLS LAST, or an OR of "later, NULL, or tied", made PostgreSQL sort every
schedule for every page (docs/PERFORMANCE.md, issue 29); filtered by operation, it reads the operation's
index (migration 0051). This EXPLAINs the statements the list really
sends, on PostgreSQL (what SQLite's planner picks for a small table is not checked here)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from rackflow.domain.schedules import CREATION_ORDER, ScheduleOrder
from rackflow.domain.tasks import Operation, OperationKind
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule
from tests.store.query_plans import explain_without_scans, statements_sent
from tests.store.schedules_support import POWER_OFF, make_env

T0 = datetime(2026, 6, 1, tzinfo=UTC)
POWER_ON = Operation(OperationKind.POWER_ON)


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
@pytest.mark.parametrize("field", ["next_run_at", "last_run_at"])
@pytest.mark.parametrize("descending", [False, True])
async def test_a_page_by_run_time_reads_its_index(db: Database, field: str, descending: bool) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    for i in range(3):
        created = await env.schedule(f"s{i}", racks=[rack])
        async with db.transaction() as conn:
            at = T0 + timedelta(hours=i % 2) if i else None  # a tie and a NULL
            await conn.execute(
                update(task_schedule)
                .where(task_schedule.c.id == created.id)
                .values(last_run_at=at, next_run_at=at)
            )
    order = ScheduleOrder(field, descending=descending)
    with statements_sent(db) as all_sent:
        async with db.read(in_transaction=True) as conn:
            first, _ = await store.list_schedules(conn, order=order, limit=1)
            await store.list_schedules(conn, order=order, limit=1, after=order.key_of(first[0]))
            await store.list_schedules(conn, order=order, limit=1, after=(None, T0, uuid.UUID(int=0)))
    sent = [(statement, parameters) for statement, parameters in all_sent if "by_run_time" in statement]
    assert len(sent) == 3
    index = f"ix_task_schedule_{field}_created_at_id"
    for statement, parameters in sent:
        plan = await explain_without_scans(db, statement, parameters)
        assert index in plan, plan
        assert "Seq Scan" not in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_a_page_filtered_by_operation_and_its_count_read_its_index(db: Database) -> None:
    """The list filtered by operation, first page, next page and capped count, reads the operation's
    index (migration 0051): without it PostgreSQL walked the list's order reading every schedule's row to
    find a rare operation's."""
    env = make_env(db)
    rack = await env.rack("r1")
    for i in range(3):
        await env.schedule(f"s{i}", racks=[rack], operation=POWER_ON if i % 2 else POWER_OFF)
    with statements_sent(db) as all_sent:
        async with db.read(in_transaction=True) as conn:
            first, _ = await store.list_schedules(conn, operation=OperationKind.POWER_OFF, limit=1)
            key = CREATION_ORDER.key_of(first[0])
            second, _ = await store.list_schedules(
                conn, operation=OperationKind.POWER_OFF, limit=1, after=key
            )
    assert [s.name for s in first + second] == ["s0", "s2"]
    sent = [
        (statement, parameters) for statement, parameters in all_sent if "operation_template" in statement
    ]
    assert len(sent) == 4  # each page and its count
    for statement, parameters in sent:
        plan = await explain_without_scans(db, statement, parameters)
        assert "ix_task_schedule_operation_kind" in plan, plan
        assert "Seq Scan" not in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_the_paused_schedules_filtered_by_operation_read_their_own_index(db: Database) -> None:
    """The paused schedules' list filtered by operation, page and capped count, reads the paused ones'
    index of the operation (migration 0053): the operation's index made PostgreSQL read the row of every
    schedule of the operation to find the few paused (an empty page read 200,000 at full size)."""
    env = make_env(db)
    rack = await env.rack("r1")
    # Half power off, a quarter paused (power on) and two paused power-off schedules: the operation's index
    # and the paused schedules' (by name) each hold many that the other filter refuses.
    made = [
        await env.schedule(f"s{i:03d}", racks=[rack], operation=POWER_OFF if i % 2 else POWER_ON)
        for i in range(200)
    ]
    paused = {made[7].id, made[151].id}
    others = {s.id for i, s in enumerate(made) if i % 4 == 0}
    async with db.transaction() as conn:
        await conn.execute(
            update(task_schedule).where(task_schedule.c.id.in_(paused | others)).values(enabled=False)
        )
        await conn.exec_driver_sql("ANALYZE task_schedule")
    with statements_sent(db) as all_sent:
        async with db.read(in_transaction=True) as conn:
            found, total = await store.list_schedules(
                conn, operation=OperationKind.POWER_OFF, paused_only=True, limit=50
            )
    assert {s.id for s in found} == paused and total == 2
    sent = [
        (statement, parameters) for statement, parameters in all_sent if "operation_template" in statement
    ]
    assert len(sent) == 2  # the page and its count
    for statement, parameters in sent:
        plan = await explain_without_scans(db, statement, parameters)
        assert "ix_task_schedule_paused_operation_kind" in plan, plan
