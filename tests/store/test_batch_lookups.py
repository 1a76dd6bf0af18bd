"""A dispatched batch's lookups by key, and the backlog count, read indexes on PostgreSQL whatever the
statistics (docs/PERFORMANCE.md, "flat as work grows").

One dispatch round reads its batch's scopes, their racks' live tasks, its racks (the window rules', the
rollout order's, the submit's lock), their components and its schedules (the submit's hold) by up to
`DISPATCH_BATCH_CAP` ids each. Written as
`column IN (…)`, PostgreSQL 15 read each of those tables in full: with statistics of the fleet as a hashed
scan that it costs below that many index probes (until the fleet is large, and then still once per batch),
and with the statistics of empty tables (a fleet loaded since they were analyzed) as matching most of the
table. These tests
EXPLAIN the statements the store sends over a fleet in both states. (The live-task read and the run prune
are tested in test_task_indexes.py and test_run_prune.py; SQLite's IN lists in the store tests as before.)
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.config import DISPATCH_BATCH_CAP
from rackflow.domain.schedules import Scope
from rackflow.store import dispatch, rollouts, windows
from rackflow.store import inventory as inventory_store
from rackflow.store import schedules as schedules_store
from rackflow.store import tasks as tasks_store
from rackflow.store.db import Database
from rackflow.store.tables import components, racks, task_schedule, task_schedule_scope, tasks
from tests.built_once import built_once
from tests.conftest import postgres_admin_url
from tests.store.query_plans import explain, statement_sent

pytestmark = pytest.mark.postgres

BATCH = DISPATCH_BATCH_CAP  # the largest dispatch batch
FLEET = 10 * BATCH  # racks, each with one component and one schedule over it
T0 = datetime(2026, 3, 1, tzinfo=UTC)
FULL_SCAN = re.compile(r"Seq Scan on (racks|components|task_schedule_scope|task_schedule|tasks)\b")


@dataclass(frozen=True)
class Fleet:
    url: str
    with_statistics: bool
    rack_ids: list[uuid.UUID]  # a batch's racks
    schedule_ids: list[uuid.UUID]  # a batch's schedules
    scopes: list[Scope]  # their scopes, each with a last task still pending


def _load(url: str, *, analyze_after: bool) -> Fleet:
    """FLEET racks, components, schedules (all due) and scopes whose last task is pending, as in a drain."""
    rack_ids = [uuid.uuid4() for _ in range(FLEET)]
    schedule_ids = [uuid.uuid4() for _ in range(FLEET)]
    task_ids = [uuid.uuid4() for _ in range(FLEET)]
    scopes = [
        Scope(uuid.uuid4(), schedule_id, rack_id, None, task_id, T0)
        for schedule_id, rack_id, task_id in zip(schedule_ids, rack_ids, task_ids, strict=True)
    ]
    operation = {"kind": "power_on"}

    async def load() -> None:
        db = Database(url)
        try:
            async with db.transaction() as conn:
                if not analyze_after:
                    await conn.exec_driver_sql("ANALYZE")
                await conn.execute(
                    insert(racks),
                    [{"id": r, "name": f"r{i}", "created_at": T0} for i, r in enumerate(rack_ids)],
                )
                await conn.execute(
                    insert(components),
                    [
                        {
                            "id": uuid.uuid4(),
                            "rack_id": r,
                            "type": "COMPUTE",
                            "name": f"c{i}",
                            "created_at": T0,
                        }
                        for i, r in enumerate(rack_ids)
                    ],
                )
                await conn.execute(
                    insert(tasks),
                    [
                        {
                            "id": t,
                            "operation": "power_on",
                            "parameters": operation,
                            "rack_id": r,
                            "component_ids": [],
                            "status": "pending",
                            "created_at": T0,
                            "updated_at": T0,
                        }
                        for t, r in zip(task_ids, rack_ids, strict=True)
                    ],
                )
                await conn.execute(
                    insert(task_schedule),
                    [
                        {
                            "id": s,
                            "name": f"s{i}",
                            "spec_type": "interval",
                            "spec": "1h",
                            "operation_template": {"operation": operation, "queue_timeout_seconds": 3600},
                            "next_run_at": T0,
                            "created_at": T0,
                            "updated_at": T0,
                        }
                        for i, s in enumerate(schedule_ids)
                    ],
                )
                await conn.execute(
                    insert(task_schedule_scope),
                    [
                        {
                            "id": sc.id,
                            "schedule_id": sc.schedule_id,
                            "rack_id": sc.rack_id,
                            "last_task_id": sc.last_task_id,
                            "created_at": T0,
                        }
                        for sc in scopes
                    ],
                )
                if analyze_after:
                    await conn.exec_driver_sql("ANALYZE")
        finally:
            await db.dispose()

    asyncio.run(load())
    return Fleet(url, analyze_after, rack_ids[:BATCH], schedule_ids[:BATCH], scopes[:BATCH])


@pytest.fixture(scope="module", params=["with_statistics", "analyzed_empty"])
def fleet(request: pytest.FixtureRequest) -> Fleet:
    """The fleet in a database of its own, analyzed after it was loaded (PostgreSQL prefers a hashed scan
    of the fleet to a batch of probes) or before (no statistics, as at a fleet's first drain); loaded once
    for every worker of the run (the tests only read it)."""
    template: str = request.getfixturevalue("pg_template")  # fails under CI, skips elsewhere, unreachable
    analyze_after = request.param == "with_statistics"
    return built_once(
        postgres_admin_url(),
        template,
        f"batch_lookups_{request.param}",
        lambda url: _load(url, analyze_after=analyze_after),
    )


Send = Callable[[Database, AsyncConnection, Fleet], Awaitable[object]]

# Each sends one statement; the index it must read.
LOOKUPS: dict[str, tuple[Send, str]] = {
    "scopes_by_schedule": (
        lambda db, conn, f: schedules_store.scopes_by_schedule(conn, f.schedule_ids),
        "uq_task_schedule_scope_schedule_id_rack_id",
    ),
    "overlapping_scope_ids": (
        lambda db, conn, f: schedules_store.overlapping_scope_ids(conn, f.scopes),
        "ix_tasks_live_rack_id",
    ),
    "rack_refs": (lambda db, conn, f: windows.rack_refs(conn, f.rack_ids), "pk_racks"),
    "rack_places": (lambda db, conn, f: rollouts.rack_places(conn, f.rack_ids), "pk_racks"),
    "lock_racks": (lambda db, conn, f: tasks_store.lock_racks(db, conn, f.rack_ids), "pk_racks"),
    "hold_schedules": (
        lambda db, conn, f: schedules_store.hold_schedules(conn, f.schedule_ids),
        "pk_task_schedule",
    ),
    "components_by_rack": (
        lambda db, conn, f: inventory_store.components_by_rack(conn, f.rack_ids),
        "ix_components_rack_id",
    ),
}


async def _plan(fleet: Fleet, send: Callable[[Database, AsyncConnection], Awaitable[object]]) -> str:
    db = Database(fleet.url)
    try:
        return await explain(db, *await statement_sent(db, lambda conn: send(db, conn)))
    finally:
        await db.dispose()


@pytest.mark.parametrize("name", LOOKUPS)
async def test_a_batch_looks_each_key_up_in_an_index(fleet: Fleet, name: str) -> None:
    send, index = LOOKUPS[name]
    plan = await _plan(fleet, lambda db, conn: send(db, conn, fleet))
    assert not FULL_SCAN.search(plan), plan
    assert index in plan, plan


# Only with statistics: without any, PostgreSQL takes the table for a few pages and sorts a scan of it, for
# the count as for the claim, which reads the same index in the same order (test_due_index.py).
@pytest.mark.parametrize("fleet", ["with_statistics"], indirect=True)
async def test_the_backlog_count_walks_at_most_its_cap_of_the_due_index(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "DUE_COUNT_CAP", BATCH)  # a backlog ten times the cap
    plan = await _plan(fleet, lambda db, conn: dispatch.count_due(conn, T0 + timedelta(minutes=1)))
    assert not FULL_SCAN.search(plan), plan
    assert re.search(r"Limit .*\n.*ix_task_schedule_due", plan), plan
