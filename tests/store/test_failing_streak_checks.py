"""The failing-streak marks (`store.streak_checks`, issue 27), on both databases: the writes that can
change a streak mark its schedule, `pause_failing` looks only at the marked schedules (a poll in which
nothing changed sends one statement), and a streak is still found when its last task ends late, by the
executor's path or a cancellation's."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import TaskStatus
from rackflow.store import streak_checks, task_runs
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import failing_streak_checks
from tests.store.query_plans import queries, statements_sent
from tests.store.schedules_support import Env, make_env


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _pausing(env: Env, count: int, name: str = "nightly") -> Schedule:
    schedule = await env.schedule(name, racks=[await env.rack(f"{name}-r1")], policy=OverlapPolicy.QUEUE)
    return await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=count
    )


async def _fire(env: Env, schedule_id: uuid.UUID) -> list[uuid.UUID]:
    """Fire the schedule by hand, a minute after its previous run (runs are ordered by when they fired)."""
    env.clock.advance(timedelta(minutes=1))
    return await env.services.schedules.trigger(schedule_id)


async def _marked(env: Env) -> set[uuid.UUID]:
    async with env.db.read() as conn:
        return set((await conn.execute(select(failing_streak_checks.c.schedule_id))).scalars())


async def _end(env: Env, task_ids: list[uuid.UUID], status: TaskStatus) -> None:
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, task_ids, status, now=env.clock.now())


async def test_a_look_with_nothing_marked_sends_one_statement_and_reads_no_schedule(env: Env) -> None:
    schedule = await _pausing(env, 2)
    (task_id,) = await _fire(env, schedule.id)
    await _end(env, [task_id], TaskStatus.FAILED)
    assert await _marked(env) == {schedule.id}

    assert await env.services.schedules.pause_failing() == []  # one failing run of two: no streak
    assert await _marked(env) == set()  # the look took the mark
    with statements_sent(env.db) as sent:
        assert await env.services.schedules.pause_failing() == []
    [probe] = queries(sent)  # the probe of failing_streak_checks; no schedule, run or task read
    assert "failing_streak_checks" in probe


async def test_a_streak_whose_last_task_ends_late_is_found_by_the_executor_path(env: Env) -> None:
    schedule = await _pausing(env, 2)
    (first,) = await _fire(env, schedule.id)
    await _end(env, [first], TaskStatus.FAILED)
    (late,) = await _fire(env, schedule.id)
    assert await env.services.schedules.pause_failing() == []  # the newest run is still going
    assert await _marked(env) == set()

    owner = uuid.uuid4()
    async with env.db.transaction() as conn:
        await task_runs.mark_running(conn, late, owner_id=owner, now=env.clock.now())
    assert await _marked(env) == set()  # starting a task decides nothing
    async with env.db.transaction() as conn:
        ended = await task_runs.finish(
            conn, {late: (TaskStatus.FAILED, "boom")}, owner_id=owner, now=env.clock.now()
        )
    assert ended == {late}
    assert await _marked(env) == {schedule.id}

    (paused,) = await env.services.schedules.pause_failing()
    assert paused[0].id == schedule.id
    assert not (await env.services.schedules.get(schedule.id)).enabled


async def test_only_final_statuses_of_schedules_that_pause_after_failures_mark(env: Env) -> None:
    pausing = await _pausing(env, 3)
    plain = await env.schedule("plain", racks=[await env.rack("plain-r1")], policy=OverlapPolicy.QUEUE)
    async with env.db.transaction() as conn:
        await streak_checks.take_marked(env.db, conn, 100)  # the update's mark
    (pausing_task,) = await _fire(env, pausing.id)
    (plain_task,) = await _fire(env, plain.id)
    async with env.db.transaction() as conn:
        await streak_checks.take_marked(env.db, conn, 100)  # the runs' marks
    await _end(env, [pausing_task, plain_task], TaskStatus.WAITING)
    assert await _marked(env) == set()
    await _end(env, [pausing_task, plain_task], TaskStatus.TERMINATED)
    assert await _marked(env) == {pausing.id}


async def test_saving_a_schedule_with_a_lower_count_finds_the_streak_it_completes(env: Env) -> None:
    schedule = await _pausing(env, 3)
    for _ in range(2):
        (task_id,) = await _fire(env, schedule.id)
        await _end(env, [task_id], TaskStatus.FAILED)
    assert await env.services.schedules.pause_failing() == []  # two of three
    await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=2
    )
    assert [s.id for s, _ in await env.services.schedules.pause_failing()] == [schedule.id]


async def test_a_look_that_fails_puts_its_marks_back(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = await _pausing(env, 2)

    async def broken(*_args: object) -> None:
        raise RuntimeError("lost connection")

    monkeypatch.setattr("rackflow.store.runs.counted_runs", broken)
    with pytest.raises(RuntimeError):
        await env.services.schedules.pause_failing()
    assert await _marked(env) == {schedule.id}


async def test_a_full_look_reads_every_schedule_whatever_is_marked(env: Env) -> None:
    schedule = await _pausing(env, 1)
    (task_id,) = await _fire(env, schedule.id)
    await _end(env, [task_id], TaskStatus.FAILED)
    async with env.db.transaction() as conn:
        await streak_checks.take_marked(env.db, conn, 100)  # a mark lost (its instance stopped)
    assert await env.services.schedules.pause_failing() == []
    assert [s.id for s, _ in await env.services.schedules.pause_failing(everything=True)] == [schedule.id]


async def test_a_look_takes_a_batch_of_marks_and_leaves_the_rest_to_the_next_polls(env: Env) -> None:
    failing = await _pausing(env, 1)
    for i in range(4):
        await _pausing(env, 1, name=f"other-{i}")
    (task_id,) = await _fire(env, failing.id)
    await _end(env, [task_id], TaskStatus.FAILED)
    async with env.db.transaction() as conn:
        await streak_checks.take_marked(env.db, conn, 100)  # every mark lost
    paused = [s.id for s, _ in await env.services.schedules.pause_failing(everything=True, batch=2)]
    assert len(await _marked(env)) == 3  # the look at everything marked all five and took two
    for _ in range(2):
        paused += [s.id for s, _ in await env.services.schedules.pause_failing(batch=2)]
    assert await _marked(env) == set()
    assert paused == [failing.id]


async def test_older_runs_tasks_are_not_read_when_the_newest_run_is_still_going(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _pausing(env, 3)
    for _ in range(2):
        (task_id,) = await _fire(env, schedule.id)
        await _end(env, [task_id], TaskStatus.FAILED)
    (going,) = await _fire(env, schedule.id)
    asked: list[set[uuid.UUID]] = []
    statuses = task_store.statuses

    async def recording(conn: Any, task_ids: Any) -> Any:
        asked.append(set(task_ids))
        return await statuses(conn, task_ids)

    monkeypatch.setattr(task_store, "statuses", recording)
    assert await env.services.schedules.pause_failing(everything=True) == []
    assert asked == [{going}]  # the two failed runs before it decide nothing

    monkeypatch.undo()
    await _end(env, [going], TaskStatus.FAILED)
    assert [s.id for s, _ in await env.services.schedules.pause_failing()] == [schedule.id]
