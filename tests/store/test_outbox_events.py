"""The outbox's events on both databases: each state change writes its event in its own transaction (a
rolled-back one writes none), with the names of what it concerns filled in; rollouts halting (and pausing
their schedule), resumed, cancelled and finished; a plain firing with a failed rack; a failed task; and a
pause that ends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rackflow.domain.inventory import RackSelection
from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import executing, finished, make_rack, submit
from tests.store.test_rollouts import _active, _end, _events, _racks, _run, _schedule

pytestmark = pytest.mark.asyncio


async def _halted(env: Env) -> tuple[Env, object]:
    racks = await _racks(env, 3)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    return env, schedule


async def test_a_halt_records_the_halt_and_the_pause_with_names(db: Database) -> None:
    env, schedule = await _halted(make_env(db))
    run = (await _run(env, schedule)).run  # type: ignore[arg-type]
    by_type = {e.type: e for e in await _events(env)}  # one transaction's events share their time
    assert set(by_type) == {EventType.RUN_HALTED, EventType.SCHEDULE_PAUSED}
    halted, paused = by_type[EventType.RUN_HALTED], by_type[EventType.SCHEDULE_PAUSED]
    assert (halted.severity, paused.severity) == (Severity.CRITICAL, Severity.WARNING)
    for event in (halted, paused):
        assert (event.schedule_name, event.operation, event.run_id) == ("fw", "power_off", run.id)
        assert event.reason == "rollout halted: 1 of 3 racks failed (limit 1)"
        assert event.principal == "rackflow"


async def test_resume_and_cancel_of_a_halted_run_clear_it(db: Database) -> None:
    env, schedule = await _halted(make_env(db))
    run_id = (await _run(env, schedule)).run.id  # type: ignore[arg-type]
    env.clock.advance(timedelta(seconds=1))
    await env.services.rollouts.resume(run_id)
    cleared = (await _events(env))[-1]
    assert (cleared.type, cleared.run_id, cleared.summary) == (
        EventType.RUN_HALT_CLEARED,
        run_id,
        "halted rollout resumed",
    )
    assert cleared.severity is Severity.CRITICAL  # as the halt it clears
    count = len(await _events(env))
    await env.services.rollouts.cancel(run_id)  # rolling, not halted: nothing clears
    assert len(await _events(env)) == count


async def test_a_rollout_that_completes_records_its_counts(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=2))
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule))
    await env.services.rollouts.advance()
    (finished,) = await _events(env)
    assert finished.type is EventType.ROLLOUT_FINISHED
    assert dict(finished.payload) == {"succeeded": 2, "failed": 0, "skipped": 0}


async def test_a_plain_firing_with_a_refused_rack_records_its_failures(db: Database) -> None:
    env = make_env(db)
    rack, other = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[rack, other])
    # A manual task on r1 makes the firing's task there conflict (REJECT: refused).
    await env.services.tasks.submit(
        Operation(OperationKind.POWER_ON), [RackSelection(rack.id)], description="", queue=QueueOptions()
    )
    await env.services.schedules.trigger(schedule.id)
    (failed,) = await _events(env)
    assert failed.type is EventType.RUN_COMPLETED_WITH_FAILURES
    assert (failed.schedule_name, failed.rack_name, failed.summary) == (
        "nightly",
        "r1",
        "schedule nightly: 1 of 2 rack(s) failed",
    )
    assert failed.reason


async def test_a_task_the_executor_fails_is_recorded_with_its_rack_and_operation(db: Database) -> None:
    env = make_env(db)
    rack = await make_rack(db)
    backend = SimulatorBackend(SimulatorConfig(step_seconds=0.01, fail_external_ids=frozenset({"gpu-1"})))
    async with executing(db, backend):
        task = await finished(db, await submit(db, rack, Operation(OperationKind.POWER_ON)))
    assert task.status is TaskStatus.FAILED
    (failed,) = await _events(env)
    assert (failed.type, failed.task_id, failed.rack_name, failed.operation) == (
        EventType.TASK_FAILED,
        task.id,
        "r1",
        "power_on",
    )
    assert failed.reason == task.message and failed.schedule_id is None


async def test_a_rolled_back_change_records_no_event(db: Database) -> None:
    env = make_env(db)
    event = Event(EventType.TASK_FAILED, Severity.WARNING, env.clock.now(), "task failed")
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await outbox.record_events(conn, [event])
            raise RuntimeError("the change fails after its event was written")
    assert await _events(env) == []


async def test_a_pause_that_ends_records_the_resume(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])
    await env.services.schedules.pause(
        schedule.id, reason="change freeze", resume_at=env.clock.now() + timedelta(seconds=1)
    )
    env.clock.advance(timedelta(seconds=2))
    assert len((await env.services.schedules.resume_ended_pauses()).resumed) == 1
    (resumed,) = await _events(env)
    assert (resumed.type, resumed.schedule_name, resumed.reason) == (
        EventType.SCHEDULE_RESUMED,
        "nightly",
        "change freeze",
    )
