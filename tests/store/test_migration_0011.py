"""Migration 0011 on a database holding racks, schedules, scopes and tasks, on both databases: schedules
keep firing as before (window policy SKIP), tasks are neither held nor overriding, a scope keeps its last
task (no table is rebuilt), and the window tables hold what they should; the downgrade drops them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, func, insert, select
from sqlalchemy.exc import IntegrityError

from rackflow.domain.windows import WindowPolicy
from rackflow.store import schedules as store
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, run_scripts
from rackflow.store.tables import (
    maintenance_window_racks,
    maintenance_windows,
    racks,
    task_schedule,
    task_schedule_scope,
    tasks,
)
from rackflow.store.tasks import get_task
from tests.conftest import database_at

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RACK, SCHEDULE, SCOPE, TASK = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


@pytest.fixture
async def db_at_0010(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0010") as db:
        yield db


async def test_upgrade_keeps_schedules_tasks_and_scopes_as_they_were(db_at_0010: Database) -> None:
    db = db_at_0010
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(task_schedule).values(
                id=SCHEDULE, name="nightly", spec_type="interval", spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                next_run_at=T0 + timedelta(hours=1), created_at=T0, updated_at=T0,
            )
        )  # fmt: skip
        await conn.execute(
            insert(tasks).values(
                id=TASK, operation="power_off", parameters={"kind": "power_off"}, rack_id=RACK,
                component_ids=[], status="pending", created_at=T0, updated_at=T0, schedule_id=SCHEDULE,
            )
        )  # fmt: skip
        await conn.execute(
            insert(task_schedule_scope).values(
                id=SCOPE, schedule_id=SCHEDULE, rack_id=RACK, last_task_id=TASK, created_at=T0
            )
        )

    assert await migrate(db) == head_revision() == await current_revision(db)

    async with db.read() as conn:
        schedule = await store.get_schedule(conn, SCHEDULE)
        assert schedule is not None and schedule.window_policy is WindowPolicy.SKIP
        task = await get_task(conn, TASK)
        assert task is not None and (task.not_before, task.ignore_windows) == (None, False)
        (scope,) = await store.list_scopes(conn, SCHEDULE)
        assert scope.last_task_id == TASK
        assert await window_store.all_windows(conn) == []


async def test_window_rows_follow_their_rack_and_the_downgrade_drops_them(db_at_0010: Database) -> None:
    db = db_at_0010
    assert await migrate(db) == head_revision()
    window_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(maintenance_windows).values(
                id=window_id, name="launch", kind="freeze", start_at=T0, end_at=T0 + timedelta(days=1),
                all_racks=False, operations=[], created_at=T0, updated_at=T0,
            )
        )  # fmt: skip
        await conn.execute(insert(maintenance_window_racks).values(window_id=window_id, rack_id=RACK))
    async with db.transaction() as conn:
        await conn.execute(racks.delete().where(racks.c.id == RACK))
    async with db.read() as conn:
        count = select(func.count()).select_from(maintenance_window_racks)
        assert (await conn.execute(count)).scalar_one() == 0
        (window,) = await window_store.all_windows(conn)
        assert (window.name, window.racks, window.all_racks) == ("launch", (), False)

    def downgrade(sync: Connection) -> list[str]:
        run_scripts(sync, "0010", down=True)
        return list(sync.dialect.get_table_names(sync))

    async with db.engine.begin() as conn:
        tables = await conn.run_sync(downgrade)
    assert await current_revision(db) == "0010"
    assert "maintenance_windows" not in tables and "maintenance_window_racks" not in tables


async def test_a_window_is_one_off_or_recurring_never_both_nor_backwards(db_at_0010: Database) -> None:
    db = db_at_0010
    await migrate(db)
    common = {"kind": "freeze", "all_racks": True, "operations": [], "created_at": T0, "updated_at": T0}
    for name, when in (
        ("both", {"cron": "0 2 * * *", "duration": "1h", "timezone": "UTC", "start_at": T0, "end_at": T0}),
        ("backwards", {"start_at": T0, "end_at": T0 - timedelta(hours=1)}),
        ("half", {"cron": "0 2 * * *"}),
        ("bad kind", {"start_at": T0, "end_at": T0 + timedelta(hours=1), "kind": "maybe"}),
    ):
        with pytest.raises(IntegrityError):
            async with db.transaction() as conn:
                await conn.execute(
                    insert(maintenance_windows).values(id=uuid.uuid4(), name=name, **{**common, **when})
                )
