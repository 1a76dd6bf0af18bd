"""The dispatcher looks on time, on both databases: it plans to wake at the earliest next run (at most one
poll interval away), an announcement of a sooner schedule ends its sleep (NOTIFY on PostgreSQL, in-process
on SQLite), a pause's end is a wake-up time too, a lost announcement still fires at the next poll, a
listener that lost its connection reconnects, and the claim batch grows while a backlog drains and returns
to its start after it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from rackflow.domain.schedules import Schedule
from rackflow.schedules import dispatcher as dispatcher_module
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.store import wakeups
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType, format_rfc3339
from tests.store.schedules_support import Env, make_env

INTERVAL = timedelta(seconds=30)
NEVER_WITHIN_THE_TEST = timedelta(hours=1)  # a poll interval no test waits for


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _db_now(env: Env) -> datetime:
    """The clock that decides what is due: the test's on both databases (`Clock.stands_for_the_database`)."""
    async with env.db.read() as conn:
        return await env.db.now(conn)


async def _one_time(env: Env, name: str, at: datetime) -> Schedule:
    spec = ScheduleSpec(SpecType.ONE_TIME, format_rfc3339(at))
    return await env.schedule(name, racks=[await env.rack(f"{name}-rack")], spec=spec)


def _dispatcher(env: Env, interval: timedelta = INTERVAL, batch: int = 10) -> Dispatcher:
    return Dispatcher(env.services.schedules, env.services.audit, interval=interval, batch=batch)


async def _fired(env: Env, schedule: Schedule, timeout_s: float = 30.0) -> bool:
    """Whether the schedule's task exists within `timeout_s` (far below any interval the test sets)."""
    for _ in range(int(timeout_s / 0.05)):
        tasks, _ = await env.services.tasks.list_tasks()
        if any(task.schedule_id == schedule.id for task in tasks):
            return True
        await asyncio.sleep(0.05)
    return False


async def _sleeping(dispatcher: Dispatcher) -> None:
    """Until the loop has finished a claim and planned its next look."""
    for _ in range(600):
        if dispatcher._wake_at is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the dispatcher never planned a wake-up")


async def test_it_plans_to_look_at_the_earliest_next_run_at_most_one_interval_away(env: Env) -> None:
    dispatcher = _dispatcher(env)
    assert await dispatcher.poll_once() == 0
    assert dispatcher.wake_after == INTERVAL  # nothing scheduled: the poll interval

    await _one_time(env, "later", await _db_now(env) + timedelta(hours=2))
    assert await dispatcher.poll_once() == 0
    assert dispatcher.wake_after == INTERVAL  # due after the interval: the interval still caps the sleep

    now = await _db_now(env)
    soon = await _one_time(env, "soon", now + timedelta(seconds=3))
    assert await dispatcher.poll_once() == 0
    assert timedelta(0) < dispatcher.wake_after <= timedelta(seconds=3)
    if env.db.is_sqlite:  # the FakeClock is the database's clock here, so time can be moved
        assert dispatcher.wake_after == timedelta(seconds=3)
        env.clock.advance(dispatcher.wake_after)
        assert await dispatcher.poll_once() == 1
        assert await _fired(env, soon)


async def test_an_announced_schedule_ends_the_sleep(env: Env) -> None:
    dispatcher, stop = _dispatcher(env, NEVER_WITHIN_THE_TEST), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        await _sleeping(dispatcher)
        assert dispatcher.wake_after == NEVER_WITHIN_THE_TEST
        schedule = await _one_time(env, "announced", await _db_now(env) + timedelta(milliseconds=300))
        env.clock.advance(timedelta(milliseconds=300))
        assert await _fired(env, schedule)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


async def test_a_resumed_and_an_updated_schedule_are_announced(env: Env) -> None:
    far = await _db_now(env) + timedelta(days=1)
    paused = await _one_time(env, "paused", await _db_now(env))
    await env.services.schedules.pause(paused.id)
    moved = await _one_time(env, "moved", far)
    dispatcher, stop = _dispatcher(env, NEVER_WITHIN_THE_TEST), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        await _sleeping(dispatcher)
        await env.services.schedules.resume(paused.id)
        assert await _fired(env, paused)
        await _sleeping(dispatcher)
        soon = format_rfc3339(await _db_now(env))
        await env.services.schedules.update(
            moved.id, ["schedule.spec"], spec_type=SpecType.ONE_TIME, spec=soon
        )
        assert await _fired(env, moved)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


async def test_it_wakes_when_a_pause_ends_and_fires_the_resumed_schedule(env: Env) -> None:
    schedule = await _one_time(env, "paused-briefly", await _db_now(env))  # due once resumed
    resume_at = await _db_now(env) + timedelta(milliseconds=500)
    await env.services.schedules.pause(schedule.id, reason="maintenance", resume_at=resume_at)
    dispatcher, stop = _dispatcher(env, NEVER_WITHIN_THE_TEST), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        await _sleeping(dispatcher)
        assert dispatcher.wake_after <= timedelta(milliseconds=500)  # the pause's end, not the interval
        env.clock.advance(timedelta(milliseconds=500))
        assert await _fired(env, schedule)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


async def test_a_schedule_in_flight_and_due_again_hides_no_later_one_and_wakes_the_loop(env: Env) -> None:
    """A schedule whose firing is still in phases 2-3 here is left out of the next claim; if it is due again
    by then, its time must not stand for the earliest next run (the loop would sleep its whole interval
    past a schedule due in seconds), and its write-back wakes the loop for it."""
    every_second = ScheduleSpec(SpecType.INTERVAL, "1s")
    busy = await env.schedule("busy", racks=[await env.rack("busy-rack")], spec=every_second)
    dispatcher = _dispatcher(env)
    await _let_pass(env, timedelta(seconds=1.2))
    first = await dispatcher._claim()
    (in_flight,) = first.firings  # claimed; its firing not yet written back
    assert in_flight.schedule.id == busy.id
    await _let_pass(env, timedelta(seconds=1.2))  # due again, still in flight
    soon = await _one_time(env, "soon", await _db_now(env) + timedelta(seconds=3))

    assert (await dispatcher._claim()).firings == []
    assert dispatcher._wake_at == soon.next_run_at  # not the interval
    assert not dispatcher._woken.is_set()
    await dispatcher._fire(first)
    assert dispatcher._woken.is_set()  # the busy schedule is due before the planned look


async def _let_pass(env: Env, time: timedelta) -> None:
    """Let `time` pass on the clock that decides what is due."""
    env.clock.advance(time)


async def test_a_lost_announcement_fires_at_the_next_poll(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    async def lost(_db: Database, _conn: object, _at: datetime) -> None:
        return None

    monkeypatch.setattr(wakeups, "announce", lost)
    dispatcher, stop = _dispatcher(env, timedelta(milliseconds=500)), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        await _sleeping(dispatcher)
        schedule = await _one_time(env, "unannounced", await _db_now(env))
        assert await _fired(env, schedule)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


def test_only_an_announcement_before_the_planned_look_wakes_the_loop() -> None:
    dispatcher = Dispatcher.__new__(Dispatcher)
    dispatcher._woken = asyncio.Event()
    planned = datetime.fromisoformat("2026-03-02T12:00:10+00:00")
    dispatcher._wake_at = planned
    dispatcher._hear(planned + timedelta(seconds=1))
    assert not dispatcher._woken.is_set()
    dispatcher._hear(planned - timedelta(seconds=1))
    assert dispatcher._woken.is_set()
    for at in (None, planned + timedelta(days=1)):  # None: the listener may have missed some
        dispatcher._woken.clear()
        dispatcher._wake_at = planned if at is None else None  # None: awake, a claim is running
        dispatcher._hear(at)
        assert dispatcher._woken.is_set()


def test_a_payload_that_is_not_an_aware_time_means_look_now() -> None:
    at = datetime.fromisoformat("2026-03-02T12:00:10.5+00:00")
    assert wakeups.payload_time(at.isoformat()) == at
    for payload in ("", "soon", "2026-03-02T12:00:10"):  # the last one naive
        assert wakeups.payload_time(payload) is None


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_a_listener_that_lost_its_connection_reconnects_and_looks(env: Env) -> None:
    dispatcher, stop = _dispatcher(env, NEVER_WITHIN_THE_TEST), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    terminate = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = current_database() AND query = 'LISTEN {wakeups.CHANNEL}'"
    )
    try:
        await _sleeping(dispatcher)
        for _ in range(600):
            async with env.db.read() as conn:
                if (await conn.exec_driver_sql(terminate)).all():
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no listener connection to terminate")
        listening = terminate.replace("pg_terminate_backend(pid)", "pid")
        for _ in range(600):  # the listener reconnects and listens again
            async with env.db.read() as conn:
                if (await conn.exec_driver_sql(listening)).all():
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the listener did not reconnect")
        schedule = await _one_time(env, "after-reconnect", await _db_now(env))
        assert await _fired(env, schedule)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)


async def test_the_batch_doubles_while_claims_come_back_full_and_returns_after(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher_module, "DISPATCH_BATCH_CAP", 8)
    now = await _db_now(env)
    for i in range(25):
        await _one_time(env, f"due{i:02d}", now)
    dispatcher = _dispatcher(env, batch=2)
    claimed = []
    for _ in range(6):
        claimed.append((await dispatcher.poll_once(), dispatcher.claim_batch))
    # 2, 4, 8 come back full (doubling up to the cap), 8 stays full, 3 does not: back to 2.
    assert claimed == [(2, 4), (4, 8), (8, 8), (8, 8), (3, 2), (0, 2)]
