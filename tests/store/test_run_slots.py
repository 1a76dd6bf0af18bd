"""A run's id names its partition (store/run_partitions.py, "A run's id names its partition"): a dispatched
run's id is minted at its slot's millisecond, and every statement naming runs by id alone is bounded to the
partitions that can hold them, so on PostgreSQL it plans the DEFAULT partition and its runs' weeks, not a
year of weeks. Every run is still reached: runs in different weeks, manual runs, and the runs the migration
found in the DEFAULT partition (an old slot, an id that is not its slot's) — and, by the reads that read
again unbounded what the bound did not find, a run an instance of the previous release recorded in a week
(its id made when it fired)."""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from rackflow.clock import FakeClock
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.firing import run_id as slot_run_id
from rackflow.domain.schedules import OverlapPolicy, ScopeOutcome
from rackflow.domain.tasks import QueueOptions, TaskStatus
from rackflow.ids import new_id
from rackflow.services import Services
from rackflow.store import dispatch, kept_counts, run_partitions
from rackflow.store import rollouts as rollout_store
from rackflow.store import runs as store
from rackflow.store import schedules as schedule_store
from rackflow.store.db import Database
from rackflow.store.tables import failing_streak_checks, task_schedule, task_schedule_run, tasks
from tests.conftest import schedule_row
from tests.store.query_plans import explain, explain_generic, statements_sent
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, rack_target

pytestmark = pytest.mark.asyncio

SOME_MONDAY = datetime(2027, 3, 1, tzinfo=UTC)  # SQLite's "weeks": any times do
PARTITION = re.compile(r"\b(task_schedule_run_(?:default|p\d{8}))\b")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def own_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of this test's own: the weeks it makes on PostgreSQL stay in it."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        shutil.copy(template, tmp_path / "rackflow.db")
        return f"sqlite:///{tmp_path / 'rackflow.db'}"
    url: str = request.getfixturevalue("pg_db")
    return url


@pytest.fixture
async def db(own_db_url: str) -> AsyncIterator[Database]:
    database = Database(own_db_url)
    yield database
    await database.dispose()


@pytest.fixture
async def pg(pg_db: str) -> AsyncIterator[Database]:
    database = Database(pg_db)
    yield database
    await database.dispose()


async def _weeks(db: Database, ahead: timedelta) -> list[datetime]:
    """The weeks' starts, made on PostgreSQL up to `ahead` from now; a Monday a week on SQLite."""
    if not db.is_postgres:
        return [SOME_MONDAY + timedelta(weeks=n) for n in range(60)]
    async with db.transaction() as conn:
        await conn.run_sync(run_partitions.ensure_partitions, datetime.now(UTC) + ahead)
        weeks = await conn.run_sync(run_partitions.weeks)
    return [week.lower for week in weeks if week.lower is not None]


async def _schedule(db: Database) -> uuid.UUID:
    """A schedule that pauses after failing runs, so a write that can change its streak marks it."""
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        row = schedule_row(schedule_id, f"s-{schedule_id}", datetime(2026, 1, 1, tzinfo=UTC))
        await conn.execute(insert(task_schedule).values({**row, "pause_after_failed_runs": 3}))
    return schedule_id


async def _record(
    db: Database, schedule_id: uuid.UUID, slot: datetime | None, run_id: uuid.UUID | None = None
) -> uuid.UUID:
    """A running run recorded as the firing records it, named as the planner names it unless `run_id`."""
    run = store.NewRun(
        run_id=run_id or slot_run_id(slot),
        schedule_id=schedule_id,
        fired_at=slot or datetime.now(UTC),
        trigger="dispatch" if slot else "manual",
        scheduled_for=slot,
    )
    async with db.transaction() as conn:
        assert await store.insert_runs(db, conn, [run]) == {run.run_id}
    return run.run_id


def _outcomes(run_id: uuid.UUID) -> list[ScopeOutcome]:
    return [
        ScopeOutcome(uuid.uuid5(run_id, "scope"), uuid.uuid5(run_id, "rack"), "submitted", task_id=run_id)
    ]


async def test_runs_of_two_weeks_a_manual_one_and_those_the_migration_found_are_all_reached(
    db: Database,
) -> None:
    weeks = await _weeks(db, timedelta(weeks=20))
    schedule_id = await _schedule(db)
    runs = {
        "this week": await _record(db, schedule_id, weeks[0] + timedelta(hours=1)),
        "weeks later": await _record(db, schedule_id, weeks[10] + timedelta(days=3, microseconds=7)),
        "manual": await _record(db, schedule_id, None),
        # In the DEFAULT partition before the weeks, as the migration found them: a random id, and an id of
        # when its row was made (minutes after its slot), neither telling the slot.
        "random id": await _record(db, schedule_id, datetime(2026, 6, 1, tzinfo=UTC), uuid.uuid4()),
        "made later": await _record(db, schedule_id, datetime(2026, 11, 30, tzinfo=UTC), new_id()),
    }
    ids = list(runs.values())

    async with db.transaction() as conn:
        assert await dispatch.claimed_runs(db, conn, [schedule_id], ids) == set(ids)
        await conn.execute(failing_streak_checks.delete())
        await store.complete_runs(conn, {run_id: _outcomes(run_id) for run_id in ids})
        marks = (await conn.execute(select(failing_streak_checks.c.schedule_id))).scalars().all()
    assert marks and set(marks) == {schedule_id}  # the write-back marked the schedule's streak

    async with db.read() as conn:
        for name, run_id in runs.items():
            run = await rollout_store.get_run(db, conn, run_id)
            head = await store.run_head(conn, run_id)
            assert run is not None and head is not None, name
            assert (run.state, list(run.outcomes)) == ("completed", _outcomes(run_id)), name
            assert [o for o, _ in await store.run_rack_page(conn, head, 0, 10)] == _outcomes(run_id), name
        tallies = await store.run_tallies(conn, ids)
        deadlines = await schedule_store.start_deadlines(conn, ids)
    assert all(tallies[run_id] == {("submitted", True): 1} for run_id in ids), tallies
    assert set(deadlines.slots) == set(ids)

    counts = {run_id: {TaskStatus.COMPLETED: 1} for run_id in ids}
    async with db.transaction() as conn:
        await kept_counts.keep(conn, counts)
    async with db.read() as conn:
        assert await kept_counts.kept(conn, ids) == (counts, {})

    async with db.transaction() as conn:
        await store.prune_runs(conn, [schedule_id], keep=0)
    async with db.read() as conn:
        assert (await conn.execute(select(task_schedule_run.c.id))).scalars().all() == []


async def _sent(db: Database, send: Callable[[Any], Awaitable[object]]) -> list[tuple[str, Any]]:
    """The statements `send` sends (in a transaction rolled back after it), each with one set of
    parameters (an executemany's first)."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            with statements_sent(db) as sent:
                await send(conn)
        finally:
            await transaction.rollback()
    return [(statement, params[0] if isinstance(params, list) else params) for statement, params in sent]


async def _planned(db: Database, sent: list[tuple[str, Any]]) -> dict[str, set[str]]:
    """The partitions of the runs each statement that reads or writes them plans."""
    planned = {}
    for statement, params in sent:
        if "task_schedule_run" in statement:
            planned[statement] = set(PARTITION.findall(await explain(db, statement, params)))
    return planned


@pytest.mark.postgres
async def test_statements_by_run_id_plan_the_default_partition_and_their_runs_week_alone(
    pg: Database,
) -> None:
    """With a year of weeks, the write-back, the kept counts, the cap's delete, the look-up of a claim in
    doubt and the reads of one run plan the DEFAULT partition and the week of the runs' slots, not every
    week; a generic plan removes the others at executor start."""
    weeks = await _weeks(pg, timedelta(weeks=52))
    assert len(weeks) >= 10  # a year of them (fewer, were a partition longer than a week)
    week = weeks[len(weeks) // 2]
    home = {run_partitions.DEFAULT_PARTITION, run_partitions.partition_name(week)}
    schedule_id = await _schedule(pg)
    ids = [await _record(pg, schedule_id, week + timedelta(days=d)) for d in (1, 2)]
    first, second = ids
    async with pg.transaction() as conn:
        await kept_counts.keep(conn, {first: {TaskStatus.COMPLETED: 1}})
        head = await store.run_head(conn, first)
    assert head is not None

    calls: dict[str, Callable[[Any], Awaitable[object]]] = {
        "write-back": lambda conn: store.complete_runs(conn, {i: _outcomes(i) for i in ids}),
        "kept counts read": lambda conn: kept_counts.kept(conn, ids),
        "kept counts written": lambda conn: kept_counts.keep(conn, {second: {TaskStatus.COMPLETED: 1}}),
        "claim in doubt": lambda conn: dispatch.claimed_runs(pg, conn, [schedule_id], ids),
        "a rollout's first step": lambda conn: rollout_store.claim_rolling(pg, conn, 10, ids),
        "one run": lambda conn: rollout_store.get_run(pg, conn, first, lock=True),
        "its head": lambda conn: store.run_head(conn, first),
        "its racks": lambda conn: store.run_rack_page(conn, head, 0, 10),
        "its tallies": lambda conn: store.run_tallies(conn, [first]),
    }
    for name, call in calls.items():
        planned = await _planned(pg, await _sent(pg, call))
        assert planned, name
        assert all(found == home for found in planned.values()), (name, planned)
        # The write-back's UPDATE returns the schedules whose streaks it marks: no look-up of them by id.
        assert name != "write-back" or len(planned) == 1, planned

    async with pg.transaction() as conn:
        await conn.execute(update(task_schedule_run).values(state="completed"))
    sent = await _sent(pg, lambda conn: store.prune_runs(conn, [schedule_id], keep=0))
    deletes = [(s, p) for s, p in sent if s.startswith("DELETE")]
    assert len(deletes) == 1
    assert list((await _planned(pg, deletes)).values()) == [home]

    ((statement, params),) = [
        sent for sent in await _sent(pg, lambda conn: rollout_store.get_run(pg, conn, first))
    ]
    generic = await explain_generic(pg, statement, params)
    assert "Subplans Removed" in generic
    assert set(PARTITION.findall(generic)) == home


@pytest.mark.postgres
async def test_a_run_an_old_instance_recorded_in_a_week_is_found_by_the_api(pg: Database) -> None:
    """An instance of the previous release, during a rolling upgrade, names a run by when it fired: one of
    a slot in a week's partition is not where its id says. The reads of one run the API asks for read
    again unbounded: its page, approval, its write-back, a retry, all find it."""
    clock = FakeClock(datetime.now(UTC))
    env = Env(pg, clock, Services.build(pg, clock))
    rack = await env.rack("r1")
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(rack),
        approval=ApprovalPolicy(timedelta(hours=4), 1),
    )
    assert await env.services.schedules.trigger(schedule.id) == []
    (listed,), _ = await env.services.schedules.list_runs(schedule.id)
    run_id = listed.id
    slot = (await _weeks(pg, timedelta(weeks=8)))[3] + timedelta(hours=5)
    async with pg.transaction() as conn:  # as the old instance's dispatcher recorded it: a week's slot
        moved = update(task_schedule_run).where(task_schedule_run.c.id == run_id)
        await conn.execute(moved.values(scheduled_for=slot, trigger="dispatch"))
    async with pg.read() as conn:
        bounded = select(task_schedule_run.c.id).where(
            task_schedule_run.c.id == run_id, await run_partitions.of_runs(conn, [run_id])
        )
        assert (await conn.execute(bounded)).all() == []  # the bound alone misses it

    summary = await env.services.rollouts.summary(run_id)
    assert (summary.run.state, summary.run.scheduled_for) == ("awaiting_approval", slot)
    assert len(await env.services.schedules.run_rack_page(summary.run, 0, 10)) == 1
    approved = await env.services.approvals.approve(run_id, "fine")
    assert approved.run.state == "completed"  # written back too
    assert {o.outcome for o in approved.run.outcomes} == {"submitted"}

    async with pg.transaction() as conn:
        await conn.execute(update(tasks).values(status=TaskStatus.FAILED.value, finished_at=clock.now()))
    retry = await env.services.schedules.retry_run(run_id)
    assert retry.run.retry_of == run_id
    assert (await env.services.rollouts.summary(run_id)).retried_by == (retry.run.id,)
