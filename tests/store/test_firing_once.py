"""Exactly once, held by the database (migration 0006), on both databases: one run per dispatched slot,
one task per rack per run, and run history pruned without touching the tasks."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from rackflow.domain.schedules import OverlapPolicy
from rackflow.errors import AlreadyExists
from rackflow.ids import id_beside, new_id
from rackflow.schedules import firing
from rackflow.store import runs as store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule, task_schedule_run, tasks
from tests.conftest import table_counts
from tests.store.schedules_support import START, Env, make_env


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


def _run(schedule_id: uuid.UUID, slot: object, trigger: str = "dispatch") -> store.NewRun:
    return store.NewRun(uuid.uuid4(), schedule_id, START, trigger, slot)  # type: ignore[arg-type]


async def test_a_second_run_of_one_slot_is_refused_by_the_store(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    slot = START + timedelta(hours=1)
    first, again, other_slot = _run(schedule.id, slot), _run(schedule.id, slot), _run(schedule.id, START)
    async with env.db.transaction() as conn:
        assert await store.insert_runs(env.db, conn, [first]) == {first.run_id}
        assert await store.insert_runs(env.db, conn, [again, other_slot]) == {other_slot.run_id}
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert total == 2 and again.run_id not in {r.id for r in runs}


async def test_the_database_itself_refuses_a_second_run_of_one_slot(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    row = {"schedule_id": schedule.id, "fired_at": START, "scheduled_for": START, "trigger": "dispatch"}
    row |= {"state": "running", "outcomes": []}
    async with env.db.transaction() as conn:
        await conn.execute(insert(task_schedule_run).values(id=uuid.uuid4(), **row))
    with pytest.raises(IntegrityError):
        async with env.db.transaction() as conn:
            await conn.execute(insert(task_schedule_run).values(id=uuid.uuid4(), **row))


async def test_manual_runs_have_no_slot_and_may_repeat(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    runs = [_run(schedule.id, None, "manual") for _ in range(3)]
    async with env.db.transaction() as conn:
        assert await store.insert_runs(env.db, conn, runs) == {r.run_id for r in runs}


async def test_a_claim_of_a_slot_already_fired_advances_the_schedule_and_fires_nothing(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """As after a clock set back on SQLite and a resume: the schedule is due again for a slot it fired."""
    schedule = await env.schedule(racks=[await env.rack("r1")])
    env.clock.advance(timedelta(hours=1))
    slot = schedule.next_run_at
    async with env.db.transaction() as conn:
        (fired,) = await firing.claim(env.db, conn, [schedule], trigger="dispatch", now=env.clock.now())
    await firing.fire(env.db, env.services.tasks, env.clock, [fired])
    async with env.db.transaction() as conn:
        await conn.execute(update(task_schedule).values(next_run_at=slot))
    before = await table_counts(env.db)
    env.clock.advance(timedelta(minutes=1))

    with caplog.at_level(logging.WARNING):
        async with env.db.transaction() as conn:
            again = replace(schedule, next_run_at=slot)
            assert await firing.claim(env.db, conn, [again], trigger="dispatch", now=env.clock.now()) == []

    assert await table_counts(env.db) == before  # no second run, no task
    assert (await env.services.schedules.get(schedule.id)).next_run_at == env.clock.now() + timedelta(hours=1)
    assert "was fired already; not firing it again" in caplog.text


async def test_a_second_task_for_a_rack_from_one_run_is_refused_naming_the_run(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    (task,) = await env.services.tasks.get_tasks([task_id])
    before = await table_counts(env.db)
    with pytest.raises(AlreadyExists, match=rf"^run_id: .*'{task.run_id}' already exists") as caught:
        async with env.db.transaction() as conn:
            await task_store.insert_tasks(conn, [replace(task, id=id_beside(task.run_id))])
    assert caught.value.field == "run_id"
    assert await table_counts(env.db) == before
    r2 = await env.rack("r2")
    async with env.db.transaction() as conn:  # another rack of the same run is fine
        await task_store.insert_tasks(conn, [replace(task, id=id_beside(task.run_id), rack_id=r2.id)])


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_a_task_not_filed_with_its_run_is_refused(env: Env) -> None:
    """On PostgreSQL the tasks are partitioned by the time their id tells, and a run's tasks are minted at
    its id's millisecond, so that its tasks share one partition, where the unique index holds one a rack
    (`store.task_partitions`). A task of the run whose id tells another time (here: none, so filed before
    the weeks) would escape that index: the tasks' CHECK refuses it."""
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    (task,) = await env.services.tasks.get_tasks([task_id])
    before = await table_counts(env.db)
    for stray in (uuid.uuid4(), new_id()):
        with pytest.raises(IntegrityError, match="tasks_filed_by_id"):
            async with env.db.transaction() as conn:
                await task_store.insert_tasks(conn, [replace(task, id=stray)])
    assert await table_counts(env.db) == before


async def test_pruning_runs_or_deleting_the_schedule_keeps_the_tasks(env: Env) -> None:
    """The tasks stay; on PostgreSQL they keep the ids of their runs, which name no run once pruned
    (migration 0036: no key); SQLite's key unlinks them."""
    schedule = await env.schedule(racks=[await env.rack("r1")], policy=OverlapPolicy.QUEUE)
    (first,) = await env.services.schedules.trigger(schedule.id)
    env.clock.advance(timedelta(minutes=1))
    (second,) = await env.services.schedules.trigger(schedule.id)
    async with env.db.transaction() as conn:
        await store.prune_runs(conn, [schedule.id], keep=1)
    run_of = {t.id: t.run_id for t in await env.services.tasks.get_tasks([first, second])}
    (kept,), _ = await env.services.schedules.list_runs(schedule.id)
    pruned = run_of[first]
    assert run_of[second] == kept.id
    if env.db.is_postgres:
        assert pruned is not None and not await env.services.schedules.has_run(pruned)
    else:
        assert pruned is None
    await env.services.schedules.delete(schedule.id)
    async with env.db.read() as conn:
        rows = (await conn.execute(select(tasks.c.id, tasks.c.run_id))).all()
    expected = [(first, pruned), (second, kept.id)] if env.db.is_postgres else [(first, None), (second, None)]
    assert sorted(rows) == sorted(expected)
