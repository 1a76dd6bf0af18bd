"""Pause with a reason and an end, on both databases: what a pause records, what replaces it, what a resume
forgets, and the dispatcher's resumption of pauses whose `resume_at` has come."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.audit import SYSTEM_PRINCIPAL, EventFilter
from rackflow.domain.schedules import Pause, Schedule
from rackflow.domain.tasks import Operation, OperationKind
from rackflow.errors import FailedPrecondition, InvalidArgument
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType
from tests.store.schedules_support import START, Env, make_env

PAST = START - timedelta(minutes=1)  # before the fake clock and the database's real clock
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)  # after both


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _set_resume_at(env: Env, schedule: Schedule, resume_at: datetime) -> None:
    """Move a pause's end (as time passing would make it come) without waiting for it."""
    assert schedule.pause is not None
    async with env.db.transaction() as conn:
        await store.save_schedule(conn, replace(schedule, pause=replace(schedule.pause, resume_at=resume_at)))


async def test_a_pause_records_its_reason_author_time_and_end(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    resume_at = START + timedelta(hours=3)
    paused = await env.services.schedules.pause(
        schedule.id, reason="PSU swap, INC-4411", resume_at=resume_at, by="oncall"
    )
    assert not paused.enabled
    assert paused.pause == Pause(reason="PSU swap, INC-4411", by="oncall", at=START, resume_at=resume_at)
    assert await env.services.schedules.get(schedule.id) == paused


async def test_pausing_again_replaces_reason_and_end_but_keeps_since_when(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    await env.services.schedules.pause(schedule.id, reason="first")
    env.clock.advance(timedelta(minutes=5))
    again = await env.services.schedules.pause(schedule.id, reason="second", resume_at=FUTURE, by="b")
    assert again.pause == Pause(reason="second", by="b", at=START, resume_at=FUTURE)
    unchanged = await env.services.schedules.pause(schedule.id)  # nothing new to say: a no-op
    assert unchanged == again


async def test_resume_forgets_the_pause(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    await env.services.schedules.pause(schedule.id, reason="x", resume_at=FUTURE)
    env.clock.advance(timedelta(minutes=10))
    resumed = await env.services.schedules.resume(schedule.id)
    assert resumed.enabled and resumed.pause is None
    assert resumed.next_run_at == START + timedelta(minutes=10, hours=1)
    assert (await env.services.schedules.get(schedule.id)).pause is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"resume_at": START}, "resume_at"),
        ({"resume_at": START - timedelta(days=1)}, "resume_at"),
        ({"reason": "x" * 1025}, "reason"),
        ({"reason": "bad\x00reason"}, "reason"),
    ],
)
async def test_bad_pauses_are_refused_naming_the_field_and_write_nothing(
    env: Env, kwargs: dict[str, object], field: str
) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        await env.services.schedules.pause(schedule.id, **kwargs)  # type: ignore[arg-type]
    assert await env.services.schedules.get(schedule.id) == schedule


async def test_ended_pauses_resume_and_others_stay(env: Env) -> None:
    ended = await env.services.schedules.pause(
        (await env.schedule("ended", racks=[await env.rack("r1")])).id, reason="a", resume_at=FUTURE
    )
    later = await env.services.schedules.pause(
        (await env.schedule("later", racks=[await env.rack("r2")])).id, reason="b", resume_at=FUTURE
    )
    forever = await env.services.schedules.pause(
        (await env.schedule("forever", racks=[await env.rack("r3")])).id, reason="c"
    )
    await _set_resume_at(env, ended, PAST)

    resumed = (await env.services.schedules.resume_ended_pauses()).resumed

    assert [(s.name, p.reason) for s, p in resumed] == [("ended", "a")]
    now = resumed[0][0].updated_at  # the database's clock (`Database.now`): what decides what is due
    after = await env.services.schedules.get(ended.id)
    assert after.enabled and after.pause is None
    assert after.next_run_at == now + timedelta(hours=1)  # restarts from the resumption, as Resume would
    assert (await env.services.schedules.get(later.id)).pause == later.pause
    assert (await env.services.schedules.get(forever.id)).pause == forever.pause
    assert (await env.services.schedules.resume_ended_pauses()).resumed == []  # once only


async def test_a_one_time_schedule_consumed_while_paused_only_forgets_its_pause(env: Env) -> None:
    spec = ScheduleSpec(SpecType.ONE_TIME, "2100-01-01T00:00:00Z")
    schedule = await env.schedule("once", racks=[await env.rack("r1")], spec=spec)
    paused = await env.services.schedules.pause(schedule.id, reason="hold", resume_at=FUTURE)
    await env.services.schedules.trigger(schedule.id)  # fires it by hand: consumed
    await _set_resume_at(env, replace(paused, next_run_at=None), PAST)

    (resumed, _pause), *_ = (await env.services.schedules.resume_ended_pauses()).resumed

    assert resumed.is_consumed and not resumed.enabled and resumed.pause is None
    with pytest.raises(FailedPrecondition):
        await env.services.schedules.pause(schedule.id, reason="again")


async def test_a_consumed_firmware_schedule_s_pause_ending_past_its_window_is_only_forgotten(
    env: Env,
) -> None:
    """It never fires again, so nothing would be skipped: its pause's end past the firmware window keeps
    nothing paused and says nothing, as any consumed one-time schedule's pause end."""
    spec = ScheduleSpec(SpecType.ONE_TIME, "2026-03-02T12:30:00Z")
    upgrade = Operation(
        OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=START + timedelta(hours=1)
    )
    schedule = await env.schedule("once", racks=[await env.rack("r1")], spec=spec, operation=upgrade)
    paused = await env.services.schedules.pause(
        schedule.id, reason="hold", resume_at=START + timedelta(minutes=10)
    )
    await env.services.schedules.trigger(schedule.id)  # fires it by hand: consumed
    await _set_resume_at(env, replace(paused, next_run_at=None), START + timedelta(minutes=90))
    env.clock.advance(timedelta(hours=2))

    ended = await env.services.schedules.resume_ended_pauses()

    assert ended.kept == []
    ((resumed, _pause),) = ended.resumed
    assert resumed.is_consumed and not resumed.enabled and resumed.pause is None


async def test_the_dispatcher_resumes_ended_pauses_and_audits_them_as_rackflow(env: Env) -> None:
    paused = await env.services.schedules.pause(
        (await env.schedule(racks=[await env.rack("r1")])).id,
        reason="maintenance",
        resume_at=FUTURE,
        by="ann",
    )
    await _set_resume_at(env, paused, PAST)
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)

    await dispatcher.resume_ended_pauses()

    assert (await env.services.schedules.get(paused.id)).enabled
    events, _ = await env.services.audit.list_events(
        EventFilter(method="ResumeTaskSchedule"), offset=0, limit=10
    )
    (event,) = events
    assert event.principal == SYSTEM_PRINCIPAL
    assert event.target_ids == (str(paused.id),)
    assert event.request["pause_ended"]["reason"] == "maintenance"
    assert event.request["pause_ended"]["by"] == "ann"
    assert event.schedule_after is not None
