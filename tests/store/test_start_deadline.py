"""Start deadlines and pause after failing runs, on both databases (docs/SAFETY.md): a dispatched firing
past its slot + deadline is recorded "missed" with its slot and how late, submits nothing, and advances
the schedule; the server's default and a schedule's own; the preview's "would be missed"; and the
dispatcher pausing a schedule after its failing streak, once, audited as rackflow."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from rackflow.domain.audit import SYSTEM_PRINCIPAL, EventFilter
from rackflow.domain.inventory import Rack
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import QueueOptions, TaskStatus
from rackflow.errors import InvalidArgument
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import schedules as store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import notification_event, tasks
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.validation import start_deadline
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, make_env, rack_target

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _due(env: Env, schedule: Schedule, late: timedelta, **changes: object) -> tuple[Schedule, datetime]:
    """Make the schedule due `late` ago by the clock that decides what is due (the database's on
    PostgreSQL); returns it and its slot."""
    async with env.db.transaction() as conn:
        slot = await env.db.now(conn) - late
        schedule = replace(schedule, next_run_at=slot, **changes)  # type: ignore[arg-type]
        await store.save_schedule(conn, schedule)
    return schedule, slot


async def _count(env: Env, stmt: object) -> int:
    async with env.db.read() as conn:
        return int((await conn.execute(stmt)).scalar_one())  # type: ignore[call-overload]


def _missed_total() -> float:
    return REGISTRY.get_sample_value("rackflow_schedule_missed_total") or 0.0


async def _dispatch(env: Env) -> int:
    return await Dispatcher(env.services.schedules, env.services.audit).poll_once()


async def test_a_firing_past_its_deadline_is_missed_and_submits_nothing(env: Env) -> None:
    racks = [await env.rack("r1"), await env.rack("r2")]
    schedule = await env.schedule(racks=racks)
    schedule, slot = await _due(env, schedule, 2 * HOUR, start_deadline=15 * MINUTE)
    before = _missed_total()

    assert await _dispatch(env) == 0  # nothing fired

    (run,), total = await env.services.schedules.list_runs(schedule.id)
    assert total == 1
    assert (run.state, run.trigger, run.scheduled_for) == ("missed", "dispatch", slot)
    assert run.late_by is not None and run.late_by >= 2 * HOUR
    assert "past its start deadline of 15m" in run.reason
    assert {(o.rack_id, o.outcome, o.task_id) for o in run.outcomes} == {
        (r.id, "missed", None) for r in racks
    }
    assert await _count(env, select(func.count()).select_from(tasks)) == 0
    after = await env.services.schedules.get(schedule.id)
    assert after.enabled and after.next_run_at is not None and after.next_run_at > slot + 2 * HOUR
    assert _missed_total() == before + 1
    missed_events = select(func.count()).where(notification_event.c.type == "run.missed")
    assert await _count(env, missed_events) == 1


async def test_a_firing_within_its_deadline_fires_as_before(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    schedule, slot = await _due(env, schedule, MINUTE, start_deadline=15 * MINUTE)

    assert await _dispatch(env) == 1

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert (run.state, run.scheduled_for, run.late_by) == ("completed", slot, None)
    assert [o.outcome for o in run.outcomes] == ["submitted"]


async def test_a_manual_trigger_is_never_missed(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    await _due(env, schedule, 10 * HOUR, start_deadline=MINUTE)

    assert len(await env.services.schedules.trigger(schedule.id)) == 1

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert (run.trigger, run.state) == ("manual", "completed")


@pytest.mark.parametrize(("own", "missed"), [(None, True), (timedelta(0), False), (3 * HOUR, False)])
async def test_the_servers_default_deadline_and_a_schedules_own(
    db: Database, own: timedelta | None, missed: bool
) -> None:
    env = make_env(db)
    env = Env(db, env.clock, Services.build(db, env.clock, default_start_deadline=15 * MINUTE))
    schedule = await env.schedule(racks=[await env.rack("r1")])
    await _due(env, schedule, 2 * HOUR, start_deadline=own)

    await _dispatch(env)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert (run.state == "missed") is missed


async def test_the_deadline_is_stored_updated_and_cleared(env: Env) -> None:
    schedule = await env.services.schedules.create(
        **{
            **_create_kwargs(env, await env.rack("r1")),
            "start_deadline": 15 * MINUTE,
            "pause_after_failed_runs": 3,
        }
    )
    assert (await env.services.schedules.get(schedule.id)).start_deadline == 15 * MINUTE
    assert (await env.services.schedules.get(schedule.id)).pause_after_failed_runs == 3
    updated = await env.services.schedules.update(
        schedule.id, ["schedule.start_deadline", "schedule.pause_after_failed_runs"], start_deadline=None
    )
    assert (updated.start_deadline, updated.pause_after_failed_runs) == (None, 0)
    assert await env.services.schedules.get(schedule.id) == updated


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"pause_after_failed_runs": -1}, "schedule.pause_after_failed_runs"),
        ({"pause_after_failed_runs": 101}, "schedule.pause_after_failed_runs"),
    ],
)
async def test_bad_input_names_the_field_and_writes_nothing(
    env: Env, kwargs: dict[str, object], field: str
) -> None:
    rack = await env.rack("r1")
    with pytest.raises(InvalidArgument, match=field):
        await env.services.schedules.create(**{**_create_kwargs(env, rack), **kwargs})
    assert (await env.services.schedules.list_schedules())[1] == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [("15", "missing unit"), ("-5m", ""), ("500ms", "at least 1s"), ("soon", "")],
)
def test_a_bad_start_deadline_names_the_field(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"schedule.start_deadline: .*{message}"):
        start_deadline(text)


def _create_kwargs(env: Env, rack: Rack) -> dict[str, Any]:
    return {
        "name": "nightly",
        "spec": HOURLY,
        "overlap_policy": OverlapPolicy.SKIP,
        "operation": POWER_OFF,
        "queue": QueueOptions(),
        "description": "",
        "target": rack_target(rack),
    }


async def test_the_preview_shows_which_slots_would_be_missed(env: Env) -> None:
    one_time = ScheduleSpec(SpecType.ONE_TIME, "2026-03-02T13:00:00Z")  # an hour after the fake clock
    schedule = await env.schedule(racks=[await env.rack("r1")], spec=one_time)
    await env.services.schedules.update(schedule.id, ["schedule.start_deadline"], start_deadline=30 * MINUTE)
    slot = datetime.fromisoformat("2026-03-02T13:00:00+00:00")

    (on_time,) = await env.services.schedules.preview_schedule(schedule.id, None, 1)
    assert (on_time.at, on_time.would_be_missed) == (slot, False)
    # Paused (or resumed) past the slot + deadline: the one-time slot would be found too late.
    paused, late = await env.services.schedules.preview_schedule(schedule.id, None, 2, resume_at=slot + HOUR)
    assert (paused.at, [s.decision for s in paused.scopes]) == (slot, [None])  # paused then
    assert (late.at, late.would_be_missed) == (slot + HOUR, True)
    assert {s.decision.action for s in late.scopes if s.decision} == {"missed"}
    _, in_time = await env.services.schedules.preview_schedule(
        schedule.id, None, 2, resume_at=slot + 10 * MINUTE
    )
    assert in_time.would_be_missed is False
    # Overdue now (the dispatcher was down): the first firing is the late slot's.
    env.clock.advance(3 * HOUR)
    (overdue,) = await env.services.schedules.preview_schedule(schedule.id, None, 1)
    assert overdue.would_be_missed is True


async def test_the_preview_of_a_resume_already_past_is_that_of_a_resume_now(env: Env) -> None:
    """A resume cannot happen before now: `--resume-at` a day ago previews what a resume now does, the
    cron's next slot; it used to restart the cron from a day ago and show a firing at once (overdue), a
    catch-up no resume makes."""
    daily = ScheduleSpec(SpecType.CRON, "0 2 * * *", "UTC")
    schedule = await env.schedule(racks=[await env.rack("r1")], spec=daily)
    now = env.clock.now()
    resumed_now = await env.services.schedules.preview_schedule(schedule.id, None, 2, resume_at=now)
    resumed_before = await env.services.schedules.preview_schedule(
        schedule.id, None, 2, resume_at=now - 24 * HOUR
    )
    assert [f.at for f in resumed_before] == [f.at for f in resumed_now]
    assert now not in [f.at for f in resumed_before]


# --- pause after failing runs ----------------------------------------------------------------------


async def _fail_runs(
    env: Env, schedule: Schedule, count: int, status: TaskStatus = TaskStatus.FAILED
) -> None:
    """Fire the schedule `count` times by hand, each run's task ending with `status`."""
    for _ in range(count):
        task_ids = await env.services.schedules.trigger(schedule.id)
        async with env.db.transaction() as conn:
            await task_store.set_status(conn, task_ids, status, now=env.clock.now())
        env.clock.advance(MINUTE)


async def test_consecutive_failing_runs_pause_the_schedule_once_audited_as_rackflow(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")], policy=OverlapPolicy.QUEUE)
    await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=3
    )
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    await _fail_runs(env, schedule, 1, TaskStatus.COMPLETED)
    await _fail_runs(env, schedule, 2)
    await dispatcher.pause_failing_schedules()
    assert (await env.services.schedules.get(schedule.id)).enabled  # two failures after a success

    await _fail_runs(env, schedule, 1)
    await dispatcher.pause_failing_schedules()
    await dispatcher.pause_failing_schedules()  # decided again (another instance): counted once

    paused = await env.services.schedules.get(schedule.id)
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    assert not paused.enabled and paused.pause is not None
    assert paused.pause.by == SYSTEM_PRINCIPAL
    assert all(str(r.id) in paused.pause.reason for r in runs[:3])
    assert str(runs[3].id) not in paused.pause.reason
    events, _ = await env.services.audit.list_events(
        EventFilter(method="PauseTaskSchedule"), offset=0, limit=10
    )
    (event,) = events
    assert event.principal == SYSTEM_PRINCIPAL
    assert event.request["failed_runs"] == [str(r.id) for r in reversed(runs[:3])]
    paused_events = select(func.count()).where(notification_event.c.type == "schedule.paused")
    assert await _count(env, paused_events) == 1

    # A resume starts the count afresh: the same runs do not pause it again.
    await env.services.schedules.resume(schedule.id)
    await dispatcher.pause_failing_schedules()
    assert (await env.services.schedules.get(schedule.id)).enabled


async def test_a_run_still_going_or_missed_does_not_count(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")], policy=OverlapPolicy.QUEUE)
    await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=2
    )
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    await _fail_runs(env, schedule, 1)
    # A missed run between the failures neither counts nor breaks the streak.
    current = await env.services.schedules.get(schedule.id)
    await _due(env, current, 2 * HOUR, start_deadline=MINUTE)
    await dispatcher.poll_once()
    await env.services.schedules.update(schedule.id, ["schedule.start_deadline"], start_deadline=None)
    (still_running,) = await env.services.schedules.trigger(schedule.id)
    await dispatcher.pause_failing_schedules()
    assert (await env.services.schedules.get(schedule.id)).enabled  # its newest run has not ended

    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [still_running], TaskStatus.FAILED, now=env.clock.now())
    await dispatcher.pause_failing_schedules()
    assert not (await env.services.schedules.get(schedule.id)).enabled
