"""The run-history prune: each schedule keeps its newest runs, and on PostgreSQL the per-batch look for
runs to delete walks the run index per schedule even while the table's statistics are those of an empty
table (a fleet's first drain), instead of reading every run (docs/PERFORMANCE.md, "flat as work grows"),
and reads no run at all for a schedule with none to delete."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from rackflow.store import runs as store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import schedule_row
from tests.e2e.cluster import sql
from tests.store.query_plans import by_parent_index, explain, statement_sent

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SCHEDULES = 200  # a large dispatch batch
RUNS_EACH = 50


async def _add_runs(db: Database, runs_each: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(SCHEDULES)]
    base = {"spec_type": "interval", "spec": "1h", "operation_template": {"kind": "power_on"}}
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule),
            [
                {**base, "id": s, "name": f"s{i}", "created_at": T0, "updated_at": T0}
                for i, s in enumerate(ids)
            ],
        )
        await conn.execute(
            insert(task_schedule_run),
            [
                {
                    "id": uuid.uuid4(),
                    "schedule_id": s,
                    "fired_at": T0 + timedelta(minutes=k),
                    "scheduled_for": T0 + timedelta(minutes=k),
                    "trigger": "dispatch",
                    "state": {0: "rolling", 1: "running"}.get(i, "completed") if k == 0 else "completed",
                    "outcomes": [],
                }
                for i, s in enumerate(ids)
                for k in range(runs_each)
            ],
        )
    return ids


async def test_each_schedule_keeps_its_newest_runs_and_open_ones(db: Database) -> None:
    ids = await _add_runs(db, 5)
    async with db.transaction() as conn:
        await store.prune_runs(conn, ids, keep=2)
    async with db.read() as conn:
        rows = (
            await conn.execute(select(task_schedule_run.c.schedule_id, task_schedule_run.c.fired_at))
        ).all()
    kept: dict[uuid.UUID, list[datetime]] = {}
    for schedule_id, fired_at in rows:
        kept.setdefault(schedule_id, []).append(fired_at)
    newest = [T0 + timedelta(minutes=4), T0 + timedelta(minutes=3)]
    assert sorted(kept[ids[0]], reverse=True) == [*newest, T0]  # the oldest is a live rollout's run
    # and here a running one's, whose firing may yet write its outcomes back (an approved run's)
    assert sorted(kept[ids[1]], reverse=True) == [*newest, T0]
    assert all(sorted(kept[s], reverse=True) == newest for s in ids[2:])


@pytest.fixture
async def pg_runs_analyzed_empty(pg_db: str) -> AsyncIterator[tuple[Database, list[uuid.UUID]]]:
    """Runs written into a database of its own after its empty tables were analyzed: no statistics at all,
    as at a fleet's first drain (a shared test database keeps whatever an earlier test's rows left, since
    ANALYZE of an empty table leaves the old statistics in place)."""
    database = Database(pg_db)
    async with database.transaction() as conn:
        await conn.exec_driver_sql("ANALYZE")
    yield database, await _add_runs(database, RUNS_EACH)
    await database.dispose()


@pytest.mark.postgres
async def test_the_prune_reads_the_run_index_with_the_statistics_of_an_empty_table(
    pg_runs_analyzed_empty: tuple[Database, list[uuid.UUID]],
) -> None:
    db, ids = pg_runs_analyzed_empty
    # nothing to delete: one statement
    plan = await explain(
        db, *await statement_sent(db, lambda conn: store.prune_runs(conn, ids, keep=RUNS_EACH))
    )
    # Not the runs (on PostgreSQL all in the DEFAULT partition: the weeks' partitions start weeks ahead, and
    # an empty one's scan reads nothing).
    assert not re.search(r"Seq Scan on task_schedule_run(_default)?\b", plan), plan
    assert "ix_task_schedule_run_schedule_id_fired_at" in plan, plan


@pytest.mark.postgres
async def test_a_schedule_with_no_run_to_delete_is_looked_at_in_the_run_index_alone(pg_db: str) -> None:
    """Every plain firing prunes its schedule's runs and mostly finds none to delete. That look reads the
    index's entries only; walking the runs in order to skip the kept ones read each from the table, a
    random page each of a year's history: 13 block reads a firing in a drain among a million schedules
    (docs/PERFORMANCE.md, "The drain among a loaded history")."""
    db = Database(pg_db)
    try:
        ids = await _add_runs(db, RUNS_EACH)
        sql(pg_db, "VACUUM ANALYZE task_schedule_run")  # the visibility map autovacuum keeps
        statement, parameters = await statement_sent(
            db, lambda conn: store.prune_runs(conn, ids, keep=RUNS_EACH)
        )
        async with db.read() as conn:
            analyzed = await conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + statement, parameters)
            text = await by_parent_index(conn, "\n".join(line for (line,) in analyzed.all()))
    finally:
        await db.dispose()
    plan = text.splitlines()
    assert "Index Only Scan using ix_task_schedule_run_schedule_id_fired_at" in text, text
    assert "Heap Fetches: 0" in text, text
    # The runs are all in the DEFAULT partition (the weeks' partitions start weeks ahead: an empty one is
    # scanned for nothing).
    walks = [
        line for line in plan if "Scan" in line and "task_schedule_run_default" in line and "Only" not in line
    ]
    assert walks, text
    assert all("(never executed)" in line for line in walks), text


@pytest.mark.parametrize("keep", [1, 2, 3, 4, 5, 6, 7])
async def test_runs_fired_at_one_instant_are_kept_by_id_across_the_cap(db: Database, keep: int) -> None:
    """Runs recorded in one transaction share its `fired_at` (manual runs, retries): the cap keeps the newest
    `keep` by (fired_at, id) descending wherever it falls among them, on both databases (each reads from the
    table only the runs at and past the (keep + 1)-th newest `fired_at`: `dialect.past_newest`)."""
    schedule_id = uuid.uuid4()
    instants = [T0 + timedelta(minutes=m) for m in (9, 8, 5, 5, 5, 5, 2, 1)]
    runs = [(uuid.uuid4(), at) for at in instants]
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule).values(schedule_row(schedule_id, "ties", T0)))
        await conn.execute(
            insert(task_schedule_run),
            [
                {
                    "id": run_id,
                    "schedule_id": schedule_id,
                    "fired_at": at,
                    "scheduled_for": None,
                    "trigger": "manual",
                    "state": "completed",
                    "outcomes": [],
                }
                for run_id, at in runs
            ],
        )
        await store.prune_runs(conn, [schedule_id], keep=keep)
    async with db.read() as conn:
        kept = set((await conn.execute(select(task_schedule_run.c.id))).scalars())
    newest = sorted(runs, key=lambda run: (run[1], run[0]), reverse=True)[:keep]
    assert kept == {run_id for run_id, _ in newest}
