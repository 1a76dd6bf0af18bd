"""Each schedule's run count (migration 0038), on both databases: every firing adds its run, a firing that
does not take the schedule to its `prune_at` (the run cap and a margin) skips the cap's look, one that does
(or whose count is not known) looks and prunes back to the cap, reads show the newest runs up to the cap
alone, and a count not known is counted at the schedule's next firing."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from rackflow.domain.inventory import Rack
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Run, Schedule
from rackflow.ids import new_id
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.store import runs as store
from rackflow.store import schedules as schedule_store
from rackflow.store.db import Database
from rackflow.store.runs import CAP_MARGIN, PRUNE_AT, RUNS_KEPT_PER_SCHEDULE, prune_at
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.store.schedules_support import START, Env, make_env

CAP = RUNS_KEPT_PER_SCHEDULE


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _schedule(env: Env) -> Schedule:
    rack: Rack = await env.rack("r1")
    return await env.schedule(racks=[rack], policy=OverlapPolicy.QUEUE)


async def _old_runs(env: Env, schedule: Schedule, count: int, *, run_count: int | None) -> None:
    """`count` completed runs fired before START, and the schedule's count set to `run_count`."""
    async with env.db.transaction() as conn:
        await store.insert_runs(
            env.db,
            conn,
            [
                store.NewRun(
                    uuid.uuid4(), schedule.id, START - timedelta(minutes=k), "dispatch", state="completed"
                )
                for k in range(1, count + 1)
            ],
        )
        await conn.execute(
            update(task_schedule).where(task_schedule.c.id == schedule.id).values(run_count=run_count)
        )


async def _runs_and_count(env: Env, schedule: Schedule) -> tuple[int, int | None]:
    async with env.db.read() as conn:
        runs = (
            await conn.execute(select(func.count()).where(task_schedule_run.c.schedule_id == schedule.id))
        ).scalar_one()
        count = (
            await conn.execute(select(task_schedule.c.run_count).where(task_schedule.c.id == schedule.id))
        ).scalar_one()
    return runs, count


async def _newest(env: Env, schedule: Schedule) -> list[Run]:
    """The schedule's runs newest first, all of them, read past every cap."""
    async with env.db.read() as conn:
        rows = await conn.execute(
            select(task_schedule_run)
            .where(task_schedule_run.c.schedule_id == schedule.id)
            .order_by(task_schedule_run.c.fired_at.desc(), task_schedule_run.c.id.desc())
        )
        return [schedule_store.run_from_row(row) for row in rows]


async def _fire(env: Env, schedule: Schedule, times: int = 1) -> None:
    for _ in range(times):
        await env.services.schedules.trigger(schedule.id)
        env.clock.advance(timedelta(minutes=1))


async def test_a_new_schedule_counts_each_firing(env: Env) -> None:
    schedule = await _schedule(env)
    assert schedule.run_count == 0
    assert await _runs_and_count(env, schedule) == (0, 0)
    await _fire(env, schedule, 3)
    assert await _runs_and_count(env, schedule) == (3, 3)
    assert (await env.services.schedules.get(schedule.id)).run_count == 3


async def test_a_firing_under_the_cap_does_not_look_past_it(env: Env) -> None:
    # The count says 5 where the history holds more than the cap (no firing of rackflow's leaves that):
    # a firing trusts the count, adds its run and deletes nothing. This is what the count saves.
    schedule = await _schedule(env)
    await _old_runs(env, schedule, CAP + 2, run_count=5)
    await _fire(env, schedule)
    assert await _runs_and_count(env, schedule) == (CAP + 3, 6)


async def test_a_schedule_past_the_cap_shows_its_newest_runs_and_is_pruned_back_at_the_margin(
    env: Env,
) -> None:
    schedule = await _schedule(env)
    await _old_runs(env, schedule, CAP - 1, run_count=CAP - 1)
    await _fire(env, schedule)  # the hundredth run: nothing to delete
    assert await _runs_and_count(env, schedule) == (CAP, CAP)
    await _fire(env, schedule, 2)  # past the cap, short of its prune_at: kept, counted, not seen
    assert await _runs_and_count(env, schedule) == (CAP + 2, CAP + 2)
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert (len(runs), total) == (CAP, CAP)
    assert runs[0].fired_at == START + timedelta(minutes=2)  # the newest, down to the hundredth newest
    assert runs[-1].fired_at == START - timedelta(minutes=CAP - 3)
    page, _ = await env.services.schedules.list_runs(schedule.id, after=(runs[-2].fired_at, runs[-2].id))
    assert [r.id for r in page] == [runs[-1].id]  # a next page stops at the cap too
    heads, heads_total = await env.services.schedules.list_runs(schedule.id, outcomes=False, limit=CAP + 5)
    assert ([r.id for r in heads], heads_total) == ([r.id for r in runs], CAP)
    at = prune_at(schedule.id)
    async with (
        env.db.transaction() as conn
    ):  # older runs up to its prune_at - 1 (more firings fill the queue)
        older = range(CAP, at - 3)
        runs_before = [
            store.NewRun(
                uuid.uuid4(), schedule.id, START - timedelta(minutes=k), "dispatch", state="completed"
            )
            for k in older
        ]
        await store.insert_runs(env.db, conn, runs_before)
        counted = update(task_schedule).where(task_schedule.c.id == schedule.id)
        await conn.execute(counted.values(run_count=at - 1))
    assert await _runs_and_count(env, schedule) == (at - 1, at - 1)
    await _fire(env, schedule)  # the firing that takes it to its prune_at prunes it back to the cap
    assert await _runs_and_count(env, schedule) == (CAP, CAP)
    after_prune, _ = await env.services.schedules.list_runs(schedule.id)
    assert [r.id for r in after_prune] == [r.id for r in (await _newest(env, schedule))]
    assert after_prune[-1].fired_at == START - timedelta(minutes=CAP - 4)


async def test_a_count_not_known_is_counted_at_the_next_firing(env: Env) -> None:
    # As migration 0038 leaves every schedule it finds: the first firing looks, prunes, then counts.
    few, many = await _schedule(env), await env.schedule("other", racks=[await env.rack("r2")])
    await _old_runs(env, few, 3, run_count=None)
    await _old_runs(env, many, CAP + 4, run_count=None)
    await _fire(env, few)
    await _fire(env, many)
    assert await _runs_and_count(env, few) == (4, 4)
    assert await _runs_and_count(env, many) == (CAP, CAP)  # counted after its prune
    await _fire(env, few)
    assert await _runs_and_count(env, few) == (5, 5)


async def test_a_dispatched_batch_counts_and_caps_each_of_its_schedules(env: Env) -> None:
    under, at, unknown = [
        await env.schedule(f"s{i}", racks=[await env.rack(f"r{i}")], policy=OverlapPolicy.QUEUE)
        for i in range(3)
    ]
    await _old_runs(env, under, 7, run_count=7)
    await _old_runs(env, at, prune_at(at.id) - 1, run_count=prune_at(at.id) - 1)
    await _old_runs(env, unknown, 2, run_count=None)
    env.clock.advance(timedelta(hours=2))  # every schedule due (interval 1h)
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    assert await dispatcher.poll_once() == 3
    assert await _runs_and_count(env, under) == (8, 8)
    assert await _runs_and_count(env, at) == (CAP, CAP)
    assert await _runs_and_count(env, unknown) == (3, 3)


async def test_a_rollouts_firing_is_counted_and_capped_when_recorded(env: Env) -> None:
    # A rollout's run is written whole in phase 1 (no write-back): its count and cap are taken there.
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)
    racks = [await env.rack("r1"), await env.rack("r2")]
    schedule = await env.schedule("rolling", racks=racks, rollout=policy)
    await _old_runs(env, schedule, prune_at(schedule.id) - 1, run_count=prune_at(schedule.id) - 1)
    await _fire(env, schedule)
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    assert runs[0].state == "rolling"
    assert await _runs_and_count(env, schedule) == (CAP, CAP)


def test_a_fleet_made_at_once_looks_on_different_firings() -> None:
    """Schedules made together fire in step; their looks are spread over CAP_MARGIN counts by their ids, so
    a day's burst does not pay every schedule's look at once."""
    ids = [new_id() for _ in range(1000)]
    counts = Counter(prune_at(i) for i in ids)
    assert set(counts) == set(range(PRUNE_AT, PRUNE_AT + CAP_MARGIN))
    assert max(counts.values()) < 2 * len(ids) / CAP_MARGIN
    assert all(prune_at(i) == prune_at(uuid.UUID(int=i.int)) for i in ids)  # the same id, the same count
