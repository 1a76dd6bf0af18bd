"""The tasks' partitions on PostgreSQL (`store.task_partitions`, migration 0062): a task is filed in the week
its id tells, with its rows in the five tables that reference it; a week with no partition is made in the
insert's transaction; the keeper makes the coming weeks; the task retention drops a past week whole, children
first, unless it holds a task the prune keeps, and deletes the rest in batches."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, select, text

from rackflow.domain.tasks import Operation, Task, TaskStatus
from rackflow.ids import id_at_time
from rackflow.store import task_partitions, task_runs
from rackflow.store import tasks as task_store
from rackflow.store.audit_partitions import PERIOD, period_start
from rackflow.store.db import Database
from rackflow.store.tables import racks, task_attempt, task_late_weeks, task_schedule, task_step_state, tasks
from tests.conftest import schedule_row
from tests.store.task_weeks import weeks_made_earlier

pytestmark = [pytest.mark.asyncio, pytest.mark.postgres]

RACK = uuid.uuid4()
EARLIER_WEEKS = 10


@pytest.fixture
async def pg(pg_db: str) -> AsyncIterator[Database]:
    """A migrated database of its own whose weeks begin EARLIER_WEEKS before this one (as a database
    migrated that long ago): the partitions before the weeks bounded earlier, the past weeks made."""
    db = Database(pg_db)
    async with db.transaction() as conn:
        await conn.run_sync(weeks_made_earlier, EARLIER_WEEKS)
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=datetime.now(UTC)))
    yield db
    await db.dispose()


def _row(task_id: uuid.UUID, status: str, at: datetime, **more: object) -> dict[str, object]:
    ended = status in ("completed", "failed", "terminated")
    return {
        "id": task_id,
        "operation": "power_on",
        "parameters": {"kind": "power_on"},
        "rack_id": RACK,
        "component_ids": [],
        "status": status,
        "created_at": at,
        "updated_at": at,
        "finished_at": at if ended else None,
        "filed_at": task_partitions.filed_at(task_id),
        **more,
    }


async def _homes(db: Database, table: str = "tasks") -> dict[uuid.UUID, str]:
    key = "id" if table == "tasks" else "task_id"
    async with db.read() as conn:
        rows = await conn.execute(text(f"SELECT {key}, tableoid::regclass::text FROM {table}"))
        return {row[0]: row[1] for row in rows}


async def _exists(db: Database, name: str) -> bool:
    async with db.read() as conn:
        return bool(await conn.scalar(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}))


async def test_a_task_filed_in_a_week_with_no_partition_has_it_made(pg: Database) -> None:
    """A task's week is made in its insert's transaction when it has none: here a run's id of 30 weeks
    ahead (a clock that far off); a week of now was made ahead by the migration and asks nothing."""
    ahead = id_at_time(datetime.now(UTC) + timedelta(weeks=30))
    week = task_partitions.partition_name("tasks", period_start(task_partitions.filed_at(ahead)))
    assert not await _exists(pg, week)
    now = datetime.now(UTC)
    task = Task(ahead, Operation.from_json({"kind": "power_on"}), RACK, (), "", TaskStatus.PENDING, "",
                None, now, None, None, now)  # fmt: skip
    async with pg.transaction() as conn:
        await task_store.insert_tasks(conn, [task])
    assert (await _homes(pg))[ahead] == week
    for child in task_partitions.CHILDREN:
        assert await _exists(pg, week.replace("tasks", child.name, 1))


async def test_the_keeper_makes_the_coming_weeks_once(pg: Database) -> None:
    made = await task_partitions.keep_ahead(pg)
    assert made == []  # the migration made them
    async with pg.read() as conn:
        weeks = await conn.run_sync(task_partitions.weeks)
    last = weeks[-1].upper
    assert last is not None and last > datetime.now(UTC) + task_partitions.LOOKAHEAD


async def test_retention_drops_a_past_week_whole_and_deletes_the_rest_in_batches(pg: Database) -> None:
    now = datetime.now(UTC)
    old, kept_week = now - timedelta(weeks=5), now - timedelta(weeks=4)
    ended = [id_at_time(old) for _ in range(3)]
    running = id_at_time(kept_week)
    ended_beside_running = id_at_time(kept_week)
    before = [uuid.uuid4(), uuid.uuid4()]  # filed before the weeks, ended long ago
    async with pg.transaction() as conn:
        await conn.execute(insert(tasks), [_row(i, "completed", old) for i in ended])
        await conn.execute(insert(tasks).values(_row(running, "running", kept_week)))
        await conn.execute(insert(tasks).values(_row(ended_beside_running, "failed", kept_week)))
        await conn.execute(insert(tasks), [_row(i, "completed", now - timedelta(days=60)) for i in before])
        for task_id in (*ended, *before):
            await conn.execute(
                insert(task_attempt).values(
                    task_id=task_id,
                    task_filed_at=task_partitions.filed_at(task_id),
                    attempt=1,
                    finished_at=old,
                    status="completed",
                )
            )
            await conn.execute(
                insert(task_step_state).values(
                    task_id=task_id,
                    task_filed_at=task_partitions.filed_at(task_id),
                    attempt=1,
                    component_id=uuid.uuid4(),
                    recorded={},
                )
            )
    homes = await _homes(pg)
    dropped_week, live_week = homes[ended[0]], homes[running]
    assert (
        dropped_week.startswith("tasks_p") and live_week.startswith("tasks_p") and dropped_week != live_week
    )
    assert (await _homes(pg, "task_attempt"))[ended[0]] == dropped_week.replace("tasks", "task_attempt", 1)

    pruned = [n async for n in task_store.prune_finished_tasks(pg, timedelta(days=14))]

    # The week of the ended tasks dropped whole; the week of the running task kept, its ended task (as old
    # as the retention) deleted by itself, with those filed before the weeks.
    assert pruned == [len(ended), len(before) + 1]
    for table in ("tasks", *(child.name for child in task_partitions.CHILDREN)):
        assert not await _exists(pg, dropped_week.replace("tasks", table, 1)), f"{table}'s week kept"
        assert await _exists(pg, live_week.replace("tasks", table, 1))
    assert set(await _homes(pg)) == {running}
    async with pg.read() as conn:
        assert (await conn.execute(select(task_attempt.c.task_id))).scalars().all() == []


async def _picked(db: Database) -> set[uuid.UUID]:
    async with db.transaction() as conn:
        picked = await task_runs.pick(
            db,
            conn,
            owner_id=uuid.uuid4(),
            lease_ttl=timedelta(seconds=30),
            running_here=(),
            now=datetime.now(UTC),
            limit=10,
        )
    return {task.id for task, _ in picked}


async def test_the_claim_reads_the_weeks_a_live_task_can_be_in(pg: Database) -> None:
    """The executor's claim reads the partition before the weeks and the weeks from `task_live_weeks.since`
    on: a task filed five weeks back (a firing that late) lowers it in its insert's transaction, so any
    instance claims it at once; a row written past that rule is claimed once the keeper's round has seen
    it."""
    now = datetime.now(UTC)
    assert await task_partitions.raise_live_since(pg) == period_start(now - task_partitions.RECENT)
    assert await _picked(pg) == set()
    late = id_at_time(now - timedelta(weeks=5))
    task = Task(late, Operation.from_json({"kind": "power_on"}), RACK, (), "", TaskStatus.PENDING, "",
                None, now, None, None, now)  # fmt: skip
    async with pg.transaction() as conn:
        await task_store.insert_tasks(conn, [task])
    assert await _picked(pg) == {late}  # picked, not started: still pending

    elsewhere = id_at_time(now - timedelta(weeks=6))
    async with pg.transaction() as conn:  # by hand: `since` not lowered
        await conn.execute(insert(tasks).values(_row(elsewhere, "pending", now)))
    assert await _picked(pg) == {late}
    assert await task_partitions.raise_live_since(pg) == period_start(task_partitions.filed_at(elsewhere))
    assert await _picked(pg) == {late, elsewhere}


async def test_pages_of_the_newest_tasks_read_their_weeks_and_the_late_ones_and_miss_none(
    pg: Database,
) -> None:
    """A newest-first page of tasks is first looked for in the newest weeks and the weeks where a task was
    created late (`task_late_weeks`, kept by migration 0063's trigger), then wider: every page of every
    kind of list, walked by key, is the list read whole, though a tenth of the tasks were created weeks
    after the week they are filed in (a rollout's later wave), some of them filed before the weeks; and
    the first pages were answered from a window."""
    rng = random.Random(29)
    now = datetime.now(UTC)
    schedule = uuid.uuid4()
    async with pg.transaction() as conn:
        await conn.execute(insert(task_schedule).values(schedule_row(schedule, "nightly", now)))
        bound = await conn.run_sync(task_partitions.first_week)
    assert bound is not None
    statuses = [s.value for s in TaskStatus]
    rows = []
    for n in range(400):
        filed = now - timedelta(days=rng.uniform(0, 7 * (EARLIER_WEEKS + 3)))
        task_id = uuid.uuid4() if n % 25 == 0 else id_at_time(filed)
        late = (
            timedelta(days=rng.uniform(7, 50)) if rng.random() < 0.1 else timedelta(minutes=rng.uniform(0, 5))
        )
        created = min(filed + late, now)
        rows.append(_row(task_id, rng.choice(statuses), created, schedule_id=schedule if n % 2 else None))
    async with pg.transaction() as conn:
        await conn.execute(insert(tasks), rows)
        late_weeks = (await conn.execute(select(task_late_weeks.c.week))).scalars().all()
    assert any(week < bound for week in late_weeks) and any(week >= bound for week in late_weeks)

    windowed: list[str] = []

    def note(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "filed_at >=" in statement and "created_at >=" in statement:
            windowed.append(statement)

    lists = [
        {},
        {"schedule_id": schedule},
        {"schedule_id": schedule, "active_only": True},
        {"statuses": [TaskStatus.FAILED, TaskStatus.COMPLETED]},
        {"rack_id": RACK, "statuses": [TaskStatus.PENDING]},
    ]
    event.listen(pg.engine.sync_engine, "before_cursor_execute", note)
    try:
        for filters in lists:
            args: dict[str, Any] = {"rack_id": None, "schedule_id": None, "active_only": False, **filters}
            async with pg.read(in_transaction=True) as conn:
                whole, _ = await task_store.list_tasks(conn, **args, offset=0, limit=None)
            for limit in (7, 40):
                walked: list[uuid.UUID] = []
                after = None
                while True:
                    async with pg.read(in_transaction=True) as conn:
                        page, _ = await task_store.list_tasks(
                            conn, **args, offset=0, limit=limit, after=after
                        )
                    walked += [task.id for task in page]
                    if len(page) < limit:
                        break
                    after = (page[-1].created_at, page[-1].id)
                assert walked == [task.id for task in whole], (filters, limit)
    finally:
        event.remove(pg.engine.sync_engine, "before_cursor_execute", note)
    assert windowed, "no page was answered from a window of weeks"


async def test_the_overview_s_reads_find_a_task_created_late_and_a_live_one_filed_far_back(
    pg: Database,
) -> None:
    """The overview's counts and failures of a day read the weeks of that day and the weeks with a task
    created late (`task_partitions.created_from`); its counts of live tasks and the list of the active ones
    read the weeks a live task can be in (`live_only`): a failed task of a run six weeks back created today
    and a pending one filed five weeks back are found by each."""
    now = datetime.now(UTC)
    failed_late = id_at_time(now - timedelta(weeks=6))
    async with pg.transaction() as conn:
        await conn.execute(insert(tasks).values(_row(failed_late, "failed", now)))
        await conn.execute(
            insert(tasks).values(_row(id_at_time(now - timedelta(weeks=7)), "failed", now - PERIOD))
        )
    pending = Task(id_at_time(now - timedelta(weeks=5)), Operation.from_json({"kind": "power_on"}), RACK, (),
                   "", TaskStatus.PENDING, "", None, now, None, None, now)  # fmt: skip
    async with pg.transaction() as conn:
        await task_store.insert_tasks(conn, [pending])
    async with pg.read(in_transaction=True) as conn:
        failed = await task_store.failed_since(conn, created_since=now - timedelta(days=1), limit=10)
        counts = await task_store.status_counts(conn, created_since=now - timedelta(days=1))
        active, total = await task_store.list_tasks(
            conn, rack_id=None, schedule_id=None, active_only=True, offset=0, limit=10
        )
    assert [task.id for task in failed] == [failed_late]
    assert counts == {TaskStatus.FAILED: 1, TaskStatus.PENDING: 1}
    assert ([task.id for task in active], total) == ([pending.id], 1)
