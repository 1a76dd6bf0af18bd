"""The capped count of the task list filtered by schedule and status reads the index of the schedule's
tasks alone (migration 0052: it carries their status), on PostgreSQL: with the status read from the
table, PostgreSQL judged a scan of every task cheaper for a status most of a large schedule's tasks have
(878 ms at full size; docs/PERFORMANCE.md, issue 29); and it reads only that status's entries (migration
0058: the status is a key), where a rare status's count read every entry of the schedule (about 350,000
at full size for 10,001 failed tasks, 102-123 ms). The page is a range of an index either way, chosen
by the statistics. A schedule's page is read from its own index even when the fleet made many more tasks
since it fired, which PostgreSQL's estimates do not see (`store.dialect.newest_from_own_index`). This
EXPLAINs the statement the list really sends (what SQLite's planner picks for a small table is not checked
here)."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from rackflow.domain.tasks import Task, TaskStatus
from rackflow.ids import id_at_time
from rackflow.store import task_partitions
from rackflow.store.db import Database
from rackflow.store.tables import racks, task_schedule, tasks
from tests.conftest import postgres_admin_url, schedule_row, task_row
from tests.e2e.cluster import fresh_postgres_database
from tests.store.query_plans import (
    explain,
    explain_after_settings,
    explain_analyzed,
    explain_without_scans,
    statements_sent,
)
from tests.store.schedule_task_lists import first_page

T0 = datetime(2026, 6, 1, tzinfo=UTC)
INDEX = "ix_tasks_schedule_id_status_created_at_id"


@pytest.fixture
def db_url(pg_template: str) -> Iterator[str]:
    """A migrated PostgreSQL database of the test's own. The worker's shared one, emptied by DELETE, kept
    the table and index pages of the tasks its earlier tests made, which weighed in the plans' costs: run
    after other modules in one worker, a page of the older schedule was sorted from the creation-time index
    and a rare status's count scanned the table (PostgreSQL estimated 1,515 of its 30 tasks)."""
    with fresh_postgres_database(postgres_admin_url(), template=pg_template) as url:
        yield url


async def _vacuumed(db: Database) -> None:
    """`tasks` as autovacuum leaves it: its pages all visible, its statistics taken."""
    async with db.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.exec_driver_sql("VACUUM ANALYZE tasks")


async def _first_page(
    db: Database, schedule: uuid.UUID | None, statuses: list[TaskStatus]
) -> tuple[list[Task], int, list[tuple[str, Any]]]:
    """The first page of 20 of the task list (of `schedule` if given, of `statuses` if any), its count,
    and the statements the list sent that read `tasks` (the count, then the page), `tasks` vacuumed first.
    The tasks here were made long before this week, so the page's tries in the newest weeks
    (`task_partitions.newest_weeks`, checked in test_task_partitions.py) find none and are left out."""
    await _vacuumed(db)
    with statements_sent(db) as all_sent:
        async with db.read(in_transaction=True) as conn:
            found, total = await first_page(conn, schedule, statuses, 20)
    return (
        found,
        total,
        [
            (statement, parameters)
            for statement, parameters in all_sent
            if "FROM tasks" in statement and "filed_at >=" not in statement
        ],
    )


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_the_count_of_a_list_filtered_by_schedule_and_status_reads_the_schedule_s_index_alone(
    db: Database,
) -> None:
    """Ten schedules of 90 tasks each on one rack, a third of them failed: the list of the first one's
    failed tasks, a page of 20 of its 30, and their count, which reads no row of the table."""
    rack, schedules = uuid.uuid4(), [uuid.uuid4() for _ in range(10)]
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        for n, schedule_id in enumerate(schedules):
            await conn.execute(insert(task_schedule).values(**schedule_row(schedule_id, f"s{n}", T0)))
        rows = [
            task_row(
                uuid.uuid4(), rack, T0 + timedelta(minutes=n), schedule_id=schedules[n % 10], status=status
            )
            for n, status in enumerate(["completed", "completed", "failed"] * 300)
        ]
        await conn.execute(insert(tasks), rows)
    found, total, (count, _page) = await _first_page(db, schedules[0], [TaskStatus.FAILED])
    assert (len(found), total) == (20, 30)
    assert all(t.status is TaskStatus.FAILED for t in found)
    plan = await explain_without_scans(db, *count)
    assert f"Index Only Scan using {INDEX}" in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_a_rare_status_of_a_large_schedule_is_counted_and_paged_from_its_own_entries(
    db: Database,
) -> None:
    """A schedule of 3,000 tasks of which 30 failed, beside another whose 3,000 tasks all failed: the count
    of the first one's failed tasks and their page read its 30 entries alone, none of its 2,970 completed
    nor of the other's failed. With the status only carried beside the schedule's list order, both walked
    every entry of the schedule (or every failed task) and filtered it."""
    rack, schedule, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        await conn.execute(insert(task_schedule).values(**schedule_row(schedule, "big", T0)))
        await conn.execute(insert(task_schedule).values(**schedule_row(other, "failing", T0)))
        rows = [
            task_row(
                uuid.uuid4(),
                rack,
                T0 + timedelta(minutes=n),
                schedule_id=schedule,
                status="failed" if n % 100 == 0 else "completed",
            )
            for n in range(3000)
        ] + [
            task_row(uuid.uuid4(), rack, T0 + timedelta(minutes=n), schedule_id=other, status="failed")
            for n in range(3000)
        ]
        await conn.execute(insert(tasks), rows)

    found, total, sent = await _first_page(db, schedule, [TaskStatus.FAILED])
    assert [t.created_at for t in found] == [T0 + timedelta(minutes=n) for n in range(2900, 900, -100)]
    assert total == 30
    for statement, parameters in sent:
        plan = await explain_analyzed(db, statement, parameters)
        assert "Rows Removed by Filter" not in plan, plan
        read = [
            int(n) for n in re.findall(rf"Index Only Scan (?:Backward )?using {INDEX} .*rows=(\d+)", plan)
        ]
        assert read and all(n <= 30 for n in read), plan


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_a_page_of_a_schedule_whose_tasks_are_old_reads_the_schedule_s_index(db: Database) -> None:
    """Half the tasks are one schedule's, all older than the other's: its page's ids come from its own
    index, stopping at the page's end, then its rows by key. Asked for whole rows, PostgreSQL walked the
    creation-time index backward from the newest task, filtering out every newer task of the other
    schedule first (at full size 200,301 of them, 113 ms)."""
    rack, old, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        for schedule_id, name in ((old, "old"), (new, "new")):
            await conn.execute(insert(task_schedule).values(**schedule_row(schedule_id, name, T0)))
        rows = [
            task_row(uuid.uuid4(), rack, T0 + timedelta(minutes=n), schedule_id=old if n < 600 else new)
            for n in range(1200)
        ]
        await conn.execute(insert(tasks), rows)

    found, _, sent = await _first_page(db, old, [])
    assert [t.created_at for t in found] == [T0 + timedelta(minutes=n) for n in range(599, 579, -1)]
    *_, (page, parameters) = sent
    plan = await explain(db, page, parameters)
    assert f"Index Only Scan Backward using {INDEX}" in plan, plan
    assert "ix_tasks_created_at " not in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
async def test_a_page_of_several_statuses_reads_each_status_s_newest_alone(db: Database) -> None:
    """The newest 2,000 tasks completed, the 600 before them failed or terminated: a page of 20 of the
    failed and terminated ones reads at most a page of each status's newest from the status index, in
    order, and merges them. As one IN list, PostgreSQL walked the creation-time index backward, filtering
    out every newer task of another status first (at full size 139,744 of them for a page, 114 ms), or
    read every task of the statuses and sorted them."""
    rack = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        ended = ["failed", "terminated"] * 300 + ["completed"] * 2000
        rows = [
            task_row(uuid.uuid4(), rack, T0 + timedelta(minutes=n), status=s) for n, s in enumerate(ended)
        ]
        await conn.execute(insert(tasks), rows)

    found, total, sent = await _first_page(db, None, [TaskStatus.TERMINATED, TaskStatus.FAILED])
    assert [t.created_at for t in found] == [T0 + timedelta(minutes=n) for n in range(599, 579, -1)]
    assert total == 600
    *_, (page, parameters) = sent
    plan = await explain_analyzed(db, page, parameters)
    # By status, over the tasks' partitions (one a week on PostgreSQL, each read in its order and merged).
    read: Counter[str] = Counter()
    for rows, status in re.findall(
        r"Index Only Scan Backward using ix_tasks_status_created_at_id .*rows=(\d+) loops=1\)\n"
        r"\s+Index Cond: \(status = '(\w+)'",
        plan,
    ):
        read[status] += int(rows)
    assert len(read) == 2 and all(n <= 20 for n in read.values()), plan  # at most a page of each status


def _made_together(
    rack: uuid.UUID, schedule: uuid.UUID, first: datetime, count: int
) -> list[dict[str, object]]:
    """`count` completed tasks of `schedule`, one a millisecond from `first`, each filed as its id says."""
    ids = [id_at_time(first + timedelta(milliseconds=n)) for n in range(count)]
    return [
        task_row(
            task_id,
            rack,
            first + timedelta(milliseconds=n),
            schedule_id=schedule,
            filed_at=task_partitions.filed_at(task_id),
        )
        for n, task_id in enumerate(ids)
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the plans checked are PostgreSQL's
@pytest.mark.parametrize("statuses", [[], [TaskStatus.COMPLETED]], ids=["every status", "one status"])
async def test_a_schedules_page_is_read_from_its_index_under_the_fleets_newer_tasks(
    db: Database, statuses: list[TaskStatus]
) -> None:
    """A schedule fired two hours ago (5,000 tasks made together), and the fleet made 40,000 tasks since:
    its first page comes from its own index, in order. PostgreSQL priced the creation-time index
    walked backward, keeping the schedule's tasks and ordering ties by an incremental sort, as if those were
    spread through the week, and walked every newer task first (at full size, under 120,000 newer ones,
    21,679 blocks and 75-96 ms for a page of the 10,000-rack schedule's completed tasks, against 2 ms)."""
    now = datetime.now(UTC)
    rack, ours, theirs = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    our_tasks = _made_together(rack, ours, now - timedelta(hours=2), 5_000)
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=now - timedelta(days=1)))
        for schedule_id, name in ((ours, "ours"), (theirs, "theirs")):
            await conn.execute(insert(task_schedule).values(**schedule_row(schedule_id, name, now)))
        await conn.execute(
            insert(tasks), our_tasks + _made_together(rack, theirs, now - timedelta(hours=1), 40_000)
        )
        # Analyzed, not vacuumed: this week's pages are still being written, so not all visible, and the
        # schedule's index is read with its rows (vacuumed, its entries alone looked cheap enough).
        await conn.exec_driver_sql("ANALYZE tasks")

    with statements_sent(db) as sent:
        async with db.read(in_transaction=True) as conn:
            found, total = await first_page(conn, ours, statuses, 50)

    assert total == 5_000
    assert [t.id for t in found] == [row["id"] for row in reversed(our_tasks[-50:])]
    plan = await explain_after_settings(db, sent, "WHERE tasks.id IN")
    assert INDEX in plan, plan
    assert "ix_tasks_created_at " not in plan, f"the fleet's newer tasks walked and filtered:\n{plan}"
