"""The look a server that can count its approvers takes before it listens, at every schedule with an
approval policy (`store.schedules.approval_set_ups`), reads those schedules alone, from their own index
(migration 0060), on both databases. A policy never set, or removed, is stored as JSON's null, which
SQL's `IS NOT NULL` keeps: the look read every schedule in name order, 120,791 buffers and 344-386 ms of
PostgreSQL's time at each start over a million schedules (docs/PERFORMANCE.md). The fleet is written
once, into a database of its own: its statistics (PostgreSQL's, of 2,003 schedules without a next run)
would otherwise stay with the worker's shared database and move the plans of the tests after it."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, null

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule
from tests.built_once import built_once
from tests.conftest import postgres_admin_url, schedule_row
from tests.store.query_plans import explain, statement_sent

INDEX = "ix_task_schedule_approval_name"
# A read of every schedule's row, in either database's EXPLAIN: a scan of the table, or of its name index.
EVERY_SCHEDULE = re.compile(
    r"Seq Scan on task_schedule\b|using uq_task_schedule_name|SCAN task_schedule USING INDEX sqlite_autoindex"
    r"|SCAN task_schedule$",
    re.M,
)
WITHOUT_POLICY = 2_000  # the fleet's other schedules: JSON's null, as every schedule made without one
T0 = datetime(2026, 6, 1, tzinfo=UTC)
POLICY = ApprovalPolicy(timedelta(hours=4), min_approvers=2)


WITH_POLICY = ["b-fw", "a-fw", "c-fw"]  # named out of their creation order


async def _write_fleet(db: Database) -> None:
    """Schedules without a policy (JSON's null; one with SQL's NULL, as a row written by hand may hold),
    and three with one."""
    plain = [schedule_row(uuid.uuid4(), f"plain-{i:05d}", T0) for i in range(WITHOUT_POLICY)]
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule), plain[1:])
        await conn.execute(insert(task_schedule).values(approval=null()), plain[0])
        for name in WITH_POLICY:
            row = schedule_row(uuid.uuid4(), name, T0)
            await conn.execute(insert(task_schedule).values(approval=POLICY.to_json()), row)
        if db.is_postgres:
            await conn.exec_driver_sql("ANALYZE task_schedule")


def _written(url: str) -> str:
    async def write() -> None:
        db = Database(url)
        try:
            await _write_fleet(db)
        finally:
            await db.dispose()

    asyncio.run(write())
    return url


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fleet_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fleet in a migrated database of its own, once per backend."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path_factory.mktemp("approval-policies") / "rackflow.db"
        shutil.copy(template, path)
        yield _written(f"sqlite:///{path}")
        return
    yield built_once(
        postgres_admin_url(), request.getfixturevalue("pg_template"), "approval_policies", _written
    )


@pytest.fixture
async def fleet(fleet_url: str) -> AsyncIterator[Database]:
    db = Database(fleet_url)
    try:
        yield db
    finally:
        await db.dispose()


async def _looked_at(db: Database) -> list[tuple[str, ApprovalPolicy]]:
    async with db.read(in_transaction=True) as conn:
        return [(s.name, s.policy) async for s in store.approval_set_ups(conn)]


async def _sent(db: Database) -> tuple[str, object]:
    async def look(conn: object) -> None:
        async for _ in store.approval_set_ups(conn):  # type: ignore[arg-type]
            pass

    return await statement_sent(db, look)


async def test_the_start_up_look_finds_each_schedule_with_a_policy_by_name(fleet: Database) -> None:
    assert await _looked_at(fleet) == [(name, POLICY) for name in sorted(WITH_POLICY)]


async def test_the_start_up_look_reads_the_schedules_with_a_policy_alone(fleet: Database) -> None:
    plan = await explain(fleet, *await _sent(fleet))

    assert INDEX in plan, plan
    assert not EVERY_SCHEDULE.search(plan), plan
