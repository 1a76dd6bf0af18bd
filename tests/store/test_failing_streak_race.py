"""The failing-streak mark a writer makes while a look takes the schedule's earlier mark
(`store.streak_checks`, migration 0029), on PostgreSQL (READ COMMITTED: a look reads what has committed
when each statement starts), step by step in one order, so the race is the same at every run.

A mark M of schedule S is committed; a writer's transaction ends S's task and marks S, and stays open; a
look takes M and commits, then reads the task still running; the writer commits. Until 0029 the writer's
mark conflicted with M and added nothing (ON CONFLICT DO NOTHING), so no mark was left and the streak
waited for the next full look, up to an hour: both tests failed. Now the writer's mark is a row of its own,
which the look could not see, and it stays."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select

from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import TaskStatus
from rackflow.store import streak_checks
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import failing_streak_checks
from tests.store.schedules_support import Env, make_env

pytestmark = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)

# Nothing here waits for a lock: a step that does fails the test instead of hanging it.
STEP_TIMEOUT_S = 10


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _pausing_fired(env: Env, runs: int) -> tuple[Schedule, uuid.UUID]:
    """A schedule pausing after `runs` failed runs, fired once by hand: it and its run's task."""
    schedule = await env.schedule("nightly", racks=[await env.rack("r1")], policy=OverlapPolicy.QUEUE)
    schedule = await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=runs
    )
    env.clock.advance(timedelta(minutes=1))
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    return schedule, task_id


async def _marks(env: Env) -> list[uuid.UUID]:
    async with env.db.read() as conn:
        return list((await conn.execute(select(failing_streak_checks.c.schedule_id))).scalars())


async def test_a_writers_mark_survives_a_look_taking_the_earlier_mark_before_it_commits(env: Env) -> None:
    schedule, task_id = await _pausing_fired(env, 1)
    assert set(await _marks(env)) == {schedule.id}  # M, committed by the firing

    async with env.db.transaction() as writer:
        await task_store.set_status(writer, [task_id], TaskStatus.FAILED, now=env.clock.now())  # marks S
        async with env.db.transaction() as look:
            taken = await asyncio.wait_for(streak_checks.take_marked(env.db, look, 200), STEP_TIMEOUT_S)
        assert taken == [schedule.id]  # the look took M and committed; the writer is still open
        assert await _marks(env) == []  # the writer's mark is not visible yet
    assert await _marks(env) == [schedule.id]  # the writer committed: its mark is there


async def test_the_streak_is_paused_by_the_next_look_not_the_next_full_look(env: Env) -> None:
    schedule, task_id = await _pausing_fired(env, 1)
    schedules = env.services.schedules

    async with env.db.transaction() as writer:
        await task_store.set_status(writer, [task_id], TaskStatus.FAILED, now=env.clock.now())
        # The look takes M and reads the task still running (the writer has not committed): no streak.
        assert await asyncio.wait_for(schedules.pause_failing(), STEP_TIMEOUT_S) == []
    paused = await asyncio.wait_for(schedules.pause_failing(), STEP_TIMEOUT_S)
    assert [s.id for s, _ in paused] == [schedule.id]
    assert not (await schedules.get(schedule.id)).enabled
