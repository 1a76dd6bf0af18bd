"""Rollouts on both databases, stepped by hand on a FakeClock: the caps, the canary gate, bake time,
halting by count and by percent, pause on halt, resume, cancel, skipped firings, and no scope started
twice. Tasks end by writing their status, as the executor would (tests/e2e/test_rollouts.py runs the
whole thing with real processes). The driver's loop: asleep while nothing rolls, woken by a rollout's
start."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rackflow.domain.audit import EventFilter
from rackflow.domain.inventory import Rack
from rackflow.domain.notifications import Event, EventType
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from rackflow.ids import id_beside
from rackflow.rollouts.driver import RolloutDriver
from rackflow.rollouts.service import RunReport, Step
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from tests.store.schedules_support import HOURLY, POWER_OFF, START, Env, make_env, rack_target

pytestmark = pytest.mark.asyncio


async def _racks(env: Env, count: int, prefix: str = "r") -> list[Rack]:
    return [await env.rack(f"{prefix}{i:02d}") for i in range(count)]


async def _schedule(env: Env, racks: Sequence[Rack], policy: RolloutPolicy, name: str = "fw") -> Schedule:
    return await env.services.schedules.create(
        name=name,
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        rollout=policy,
    )


async def _run(env: Env, schedule: Schedule) -> RunReport:
    runs, _ = await env.services.schedules.list_runs(schedule.id, limit=1)
    return await env.services.rollouts.get(runs[0].id)


async def _tasks(env: Env, schedule: Schedule) -> list[Task]:
    found, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    return found


async def _active(env: Env, schedule: Schedule) -> list[Task]:
    return [t for t in await _tasks(env, schedule) if t.status.is_active]


async def _end(env: Env, tasks: Sequence[Task], status: TaskStatus = TaskStatus.COMPLETED) -> None:
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [t.id for t in tasks], status, now=env.clock.now())


async def _events(env: Env) -> list[Event]:
    async with env.db.read() as conn:
        return list(reversed(await outbox.list_events(conn, 100)))


def _names(env_racks: Sequence[Rack], tasks: Sequence[Task]) -> list[str]:
    by_id = {r.id: r.name for r in env_racks}
    return sorted(by_id[t.rack_id] for t in tasks)


async def test_max_concurrent_racks_is_never_exceeded_and_the_run_completes(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 5)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=2))
    first = await env.services.schedules.trigger(schedule.id)
    assert len(first) == 2
    report = await _run(env, schedule)
    assert report.run.state == "rolling"
    assert report.progress is not None and (report.progress.active, report.progress.pending) == (2, 3)
    assert [o.outcome for o in report.run.outcomes] == [
        "submitted",
        "submitted",
        "pending",
        "pending",
        "pending",
    ]
    assert (await env.services.rollouts.advance()).task_ids == ()  # no room
    while active := await _active(env, schedule):
        assert len(active) <= 2
        await _end(env, active[:1])
        await env.services.rollouts.advance()
        assert len(await _active(env, schedule)) <= 2
    await env.services.rollouts.advance()
    report = await _run(env, schedule)
    assert report.run.state == "completed"
    assert report.progress is not None and report.progress.succeeded == 5
    assert _names(racks, await _tasks(env, schedule)) == [r.name for r in racks]  # each rack once


async def test_a_trigger_names_the_first_wave_another_instance_s_driver_started(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger's own first step finds the run another instance's rollout driver has just stepped (as
    when that driver, woken by the rollout's start, takes it first): that step starts nothing, and the
    trigger's answer still names the wave the other one started, not an empty list."""
    env = make_env(db)
    racks = await _racks(env, 4)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=2))
    other = Services.build(db, env.clock)  # another instance, whose driver steps every rolling run
    own_advance = env.services.rollouts.advance
    by_the_other: list[Step] = []

    async def the_other_first(run_ids: Collection[uuid.UUID] | None = None, **kwargs: Any) -> Step:
        by_the_other.append(await other.rollouts.advance())
        return await own_advance(run_ids, **kwargs)

    monkeypatch.setattr(env.services.rollouts, "advance", the_other_first)
    answered = await env.services.schedules.trigger(schedule.id)
    (step,) = by_the_other
    assert len(step.task_ids) == 2  # the other instance started the wave; the trigger's step, nothing
    assert sorted(answered) == sorted(step.task_ids)
    assert sorted(answered) == sorted(t.id for t in await _active(env, schedule))


async def test_a_trigger_whose_first_wave_another_instance_started_before_the_deletion_says_so(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another instance's rollout driver takes the trigger's first step (its wave of two racks started),
    then DeleteSchedule commits, before the trigger's own step, which finds no run. On PostgreSQL the
    wave's tasks still name the run, and the trigger answers with them; on SQLite the deletion cleared
    the run's id from its tasks, and the trigger answers NotFound saying another instance's step may have
    started racks first. Before, it answered OK with no task, while two racks were being acted on."""
    env = make_env(db)
    racks = await _racks(env, 4)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=2))
    other = Services.build(db, env.clock)
    own_advance = env.services.rollouts.advance
    by_the_other: list[Step] = []

    async def the_other_first_then_deleted(
        run_ids: Collection[uuid.UUID] | None = None, **kwargs: Any
    ) -> Step:
        by_the_other.append(await other.rollouts.advance())
        await env.services.schedules.delete(schedule.id)
        return await own_advance(run_ids, **kwargs)

    monkeypatch.setattr(env.services.rollouts, "advance", the_other_first_then_deleted)
    if db.is_sqlite:
        with pytest.raises(NotFound, match=r"a rollout driver's step may have started racks of it first"):
            await env.services.schedules.trigger(schedule.id)
    else:
        answered = await env.services.schedules.trigger(schedule.id)
        (step,) = by_the_other
        assert sorted(answered) == sorted(step.task_ids)
    (step,) = by_the_other
    assert len(step.task_ids) == 2


async def test_a_trigger_whose_schedule_is_deleted_before_its_first_step_is_not_found(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits between a rollout trigger's claim and its first step, which starts nothing:
    NotFound, as for a plain trigger, rather than OK with no task. On PostgreSQL no task names the run,
    so nothing was started; on SQLite that cannot be told (the deletion clears a run's id from its
    tasks), and the answer says a step of another instance may have started racks first."""
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1))
    env.delete_before_its_submit(monkeypatch, schedule)
    nothing = "nothing was submitted" if not db.is_sqlite else "may have started racks of it first"
    with pytest.raises(NotFound, match=rf"^id: schedule 'fw' \({schedule.id}\) was deleted, .*{nothing}"):
        await env.services.schedules.trigger(schedule.id)
    assert await _active(env, schedule) == []


async def test_scopes_start_in_rack_name_order(db: Database) -> None:
    env = make_env(db)
    racks = [await env.rack(name) for name in ("c", "a", "b")]
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1))
    await env.services.schedules.trigger(schedule.id)
    started = []
    for _ in range(3):
        (task,) = await _active(env, schedule)
        started += _names(racks, [task])
        await _end(env, [task])
        await env.services.rollouts.advance()
    assert started == ["a", "b", "c"]


async def test_max_per_domain_counts_a_rack_without_a_domain_as_its_own(db: Database) -> None:
    env = make_env(db)
    a = await _racks(env, 3, "a")
    b = await _racks(env, 3, "b")
    loose = await _racks(env, 2, "z")
    await env.services.inventory.create_domain("dom-a", [r.id for r in a])
    await env.services.inventory.create_domain("dom-b", [r.id for r in b])
    schedule = await _schedule(env, [*a, *b, *loose], RolloutPolicy(max_per_domain=1))
    await env.services.schedules.trigger(schedule.id)
    assert _names([*a, *b, *loose], await _active(env, schedule)) == ["a00", "b00", "z00", "z01"]
    await _end(env, [t for t in await _active(env, schedule) if t.rack_id == a[0].id])
    await env.services.rollouts.advance()
    assert _names([*a, *b, *loose], await _active(env, schedule)) == ["a01", "b00", "z00", "z01"]


async def test_canaries_go_first_and_the_rest_wait_for_the_bake_time(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 6)
    policy = RolloutPolicy(max_concurrent_racks=3, canary_racks=2, bake_time=timedelta(minutes=15))
    schedule = await _schedule(env, racks, policy)
    await env.services.schedules.trigger(schedule.id)
    canaries = await _active(env, schedule)
    assert _names(racks, canaries) == ["r00", "r01"]
    report = await _run(env, schedule)
    assert report.progress is not None and report.progress.wave == "canary"
    assert [o.canary for o in report.run.outcomes] == [True, True, False, False, False, False]
    await _end(env, canaries[:1])
    assert (await env.services.rollouts.advance()).task_ids == ()  # one canary still running
    env.clock.advance(timedelta(minutes=5))
    await _end(env, canaries[1:])
    done_at = env.clock.now()
    assert (await env.services.rollouts.advance()).task_ids == ()  # baking
    report = await _run(env, schedule)
    assert report.progress is not None and report.progress.wave == "bake"
    assert report.progress.bake_until == done_at + timedelta(minutes=15)
    env.clock.advance(timedelta(minutes=15) - timedelta(seconds=1))
    assert (await env.services.rollouts.advance()).task_ids == ()
    env.clock.advance(timedelta(seconds=1))
    assert len((await env.services.rollouts.advance()).task_ids) == 3
    report = await _run(env, schedule)
    assert report.progress is not None and report.progress.wave == "rest"


async def test_a_failed_canary_halts_everything_after_it_and_pauses_the_schedule(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 4)
    schedule = await _schedule(env, racks, RolloutPolicy(canary_racks=1))
    halts = REGISTRY.get_sample_value("rackflow_rollout_halts_total") or 0.0
    (canary,) = await env.services.schedules.trigger(schedule.id)
    assert len(await _active(env, schedule)) == 1
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    assert REGISTRY.get_sample_value("rackflow_rollout_halts_total") == halts + 1
    report = await _run(env, schedule)
    assert report.run.state == "halted"
    assert report.run.reason == "rollout halted: canary r00 failed"
    assert [o.outcome for o in report.run.outcomes] == [
        "submitted",
        "not_started",
        "not_started",
        "not_started",
    ]
    assert report.task_statuses[canary] is TaskStatus.FAILED
    paused = await env.services.schedules.get(schedule.id)
    assert not paused.enabled and paused.pause is not None
    assert (paused.pause.reason, paused.pause.by) == ("rollout halted: canary r00 failed", "rackflow")
    (event,), _ = await env.services.audit.list_events(EventFilter(method="PauseTaskSchedule"))
    assert (event.principal, event.request["reason"]) == ("rackflow", "rollout halted: canary r00 failed")
    assert str(report.run.id) in event.target_ids
    assert len(await _tasks(env, schedule)) == 1


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (
            RolloutPolicy(max_concurrent_racks=3, halt_after_failures=2),
            "rollout halted: 2 of 10 racks failed (limit 2)",
        ),
        (
            RolloutPolicy(max_concurrent_racks=3, halt_after_failure_percent=20),
            "rollout halted: 2 of 10 racks failed (limit 20%)",
        ),
    ],
)
async def test_halts_at_exactly_the_threshold_and_running_tasks_finish(
    db: Database, policy: RolloutPolicy, reason: str
) -> None:
    env = make_env(db)
    racks = await _racks(env, 10)
    schedule = await _schedule(env, racks, policy)
    await env.services.schedules.trigger(schedule.id)
    first = await _active(env, schedule)
    await _end(env, first[:1], TaskStatus.FAILED)
    await env.services.rollouts.advance()
    report = await _run(env, schedule)
    assert report.run.state == "rolling" and report.progress is not None and report.progress.active == 3
    await _end(env, (await _active(env, schedule))[:1], TaskStatus.FAILED)
    await env.services.rollouts.advance()
    report = await _run(env, schedule)
    assert report.run.state == "halted"
    assert report.run.reason == reason
    assert report.progress is not None
    assert (report.progress.failed, report.progress.active, report.progress.not_started) == (2, 2, 6)
    assert len(await _active(env, schedule)) == 2  # not cancelled
    assert not (await env.services.schedules.get(schedule.id)).enabled


@pytest.mark.parametrize("pause_on_halt", [True, False])
async def test_a_limit_reached_after_every_rack_began_pauses_the_schedule_as_a_halt_would(
    db: Database, pause_on_halt: bool
) -> None:
    """Nothing is left to halt (no cap held a rack back), so the run completes with its failures; but its
    schedule would roll the same change out again at its next firing, so the limit pauses it, as a halt
    does (and only as `pause_on_halt` lets a halt)."""
    env = make_env(db)
    racks = await _racks(env, 4)
    schedule = await _schedule(env, racks, RolloutPolicy(halt_after_failures=2, pause_on_halt=pause_on_halt))
    await env.services.schedules.trigger(schedule.id)
    begun = await _active(env, schedule)
    assert len(begun) == 4  # no cap: every rack began in the first wave
    await _end(env, begun[:2], TaskStatus.FAILED)
    await _end(env, begun[2:])
    await env.services.rollouts.advance()
    report = await _run(env, schedule)
    assert report.run.state == "completed"
    reason = "rollout completed over its failure limit: 2 of 4 racks failed (limit 2)"
    after = await env.services.schedules.get(schedule.id)
    paused, _ = await env.services.audit.list_events(EventFilter(method="PauseTaskSchedule"))
    events = [e.type for e in await _events(env)]
    if not pause_on_halt:
        assert after.enabled and not paused
        assert EventType.SCHEDULE_PAUSED not in events
        return
    assert not after.enabled and after.pause is not None
    assert (after.pause.reason, after.pause.by) == (reason, "rackflow")
    (event,) = paused
    assert (event.principal, event.request["reason"]) == ("rackflow", reason)
    assert str(report.run.id) in event.target_ids
    assert EventType.SCHEDULE_PAUSED in events and EventType.ROLLOUT_FINISHED in events


async def test_a_rollout_completed_under_its_limit_pauses_nothing(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 4)
    schedule = await _schedule(env, racks, RolloutPolicy(halt_after_failures=2))
    await env.services.schedules.trigger(schedule.id)
    begun = await _active(env, schedule)
    await _end(env, begun[:1], TaskStatus.FAILED)
    await _end(env, begun[1:])
    await env.services.rollouts.advance()
    assert (await _run(env, schedule)).run.state == "completed"
    assert (await env.services.schedules.get(schedule.id)).enabled


async def test_pause_on_halt_false_leaves_the_schedule_enabled(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 3)
    schedule = await _schedule(
        env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)
    )
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    assert (await _run(env, schedule)).run.state == "halted"
    assert (await env.services.schedules.get(schedule.id)).enabled


async def test_the_preview_of_a_schedule_whose_rollout_is_live_says_its_firings_are_skipped(
    db: Database,
) -> None:
    """WINDOWS.md, "See it before it happens": the preview runs the dispatcher's planner, which skips a
    firing while the schedule's previous rollout is rolling or halted. A halt that does not pause the
    schedule left it firing (skipped), and the preview said "fire" for every rack of those firings."""
    env = make_env(db)
    racks = await _racks(env, 3)
    schedule = await _schedule(
        env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)
    )
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    run_id = (await _run(env, schedule)).run.id

    [firing, *_] = await env.services.schedules.preview_schedule(schedule.id, None, 2)
    assert {s.decision.action if s.decision else None for s in firing.scopes} == {"skip_run"}
    why = f"the schedule's previous rollout (run {run_id}) is still halted (resume or cancel it first)"
    assert {s.reason for s in firing.scopes} == {why}

    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    env.clock.advance(timedelta(hours=1))
    await dispatcher.poll_once()
    assert ((await _run(env, schedule)).run.state, (await _run(env, schedule)).run.reason) == ("skipped", why)


async def test_resume_counts_failures_from_zero_and_cancel_ends_the_run(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 5)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    run_id = (await _run(env, schedule)).run.id

    # A trigger while the rollout is halted is refused and records nothing.
    with pytest.raises(FailedPrecondition, match=f"previous rollout \\(run {run_id}\\) is still halted"):
        await env.services.schedules.trigger(schedule.id)
    assert (await env.services.schedules.list_runs(schedule.id))[1] == 1
    # A dispatched one is recorded as skipped, with the reason.
    await env.services.schedules.resume(schedule.id)
    env.clock.advance(timedelta(hours=1))
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    assert await dispatcher.poll_once() == 0  # nothing to fire
    skipped = await _run(env, schedule)
    assert (
        skipped.run.state == "skipped"
        and skipped.run.reason
        == f"the schedule's previous rollout (run {run_id}) is still halted (resume or cancel it first)"
    )
    assert skipped.run.outcomes == ()
    with pytest.raises(FailedPrecondition, match="is skipped; only a halted rollout can be resumed"):
        await env.services.rollouts.resume(skipped.run.id)
    await env.services.schedules.pause(schedule.id)

    report = await env.services.rollouts.resume(run_id)
    assert report.run.state == "rolling" and report.run.failures_excused == 1
    assert report.run.reason == "" and "not_started" not in {o.outcome for o in report.run.outcomes}
    assert not (await env.services.schedules.get(schedule.id)).enabled  # a resume fires nothing more
    assert report.progress is not None and (report.progress.active, report.progress.failures_counted) == (
        1,
        0,
    )
    with pytest.raises(FailedPrecondition, match="is rolling; only a halted rollout can be resumed"):
        await env.services.rollouts.resume(run_id)
    await _end(env, await _active(env, schedule))
    await env.services.rollouts.advance()
    assert (await env.services.rollouts.get(run_id)).run.state == "rolling"

    [submitted] = await _active(env, schedule)  # submitted, not claimed yet
    report = await env.services.rollouts.cancel(run_id)
    assert report.run.state == "cancelled"
    assert "3 scope(s) not started, 1 of them by ending a task that had not begun" in report.run.reason
    assert "tasks already started were not cancelled" in report.run.reason
    assert report.progress is not None and report.progress.not_started == 3 and report.progress.active == 0
    assert report.task_statuses[submitted.id] is TaskStatus.TERMINATED
    assert await _active(env, schedule) == []
    with pytest.raises(FailedPrecondition, match="is cancelled"):
        await env.services.rollouts.cancel(run_id)
    await env.services.rollouts.advance()
    assert len(await _tasks(env, schedule)) == 3  # nothing more started

    # The next firing rolls out again.
    await env.services.schedules.resume(schedule.id)
    assert len(await env.services.schedules.trigger(schedule.id)) == 1


async def _firmware(env: Env, racks: Sequence[Rack], end: datetime, policy: RolloutPolicy) -> Schedule:
    """A rollout upgrading `racks`' firmware until `end`."""
    return await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=end),
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        rollout=policy,
    )


async def test_a_rollout_still_waiting_at_its_firmware_window_s_end_is_cancelled_by_rackflow(
    db: Database,
) -> None:
    """A wave started then would only fail unrun at its claim, and no resume could move the end, so a halt
    could only wait for an operator's cancel: at the end_time rackflow cancels the run itself, saying why,
    its racks not started "not_started", a task submitted and not begun ended as a cancel ends it, running
    ones left to finish; its schedule paused by rackflow as a halt's; audited (the pause and the cancel, by
    rackflow) and notified once (run.cancelled, no halt to clear)."""
    env = make_env(db)
    racks = await _racks(env, 5)
    schedule = await _firmware(
        env, racks, START + timedelta(minutes=70), RolloutPolicy(max_concurrent_racks=3)
    )
    assert len(await env.services.schedules.trigger(schedule.id)) == 3
    env.clock.advance(timedelta(minutes=20))
    await _end(env, (await _active(env, schedule))[:1])
    assert len((await env.services.rollouts.advance()).task_ids) == 1  # within the window: goes on
    running, ending, unbegun = await _active(env, schedule)
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [running.id], TaskStatus.RUNNING, now=env.clock.now())
    env.clock.advance(timedelta(minutes=50))  # the end itself: the window is half-open
    await _end(env, [ending])  # room for the last rack

    assert (await env.services.rollouts.advance()).task_ids == ()

    report = await _run(env, schedule)
    why = (
        "rollout cancelled by rackflow: its firmware window ended at 2026-03-02T13:10:00Z (its upgrade's "
        "end_time): no wave starts at or after it, as each of its tasks would fail unrun, and no resume "
        "could move the end; create a new schedule with a later end_time for its racks not started"
    )
    assert report.run.state == "cancelled"
    assert report.run.reason == (
        f"{why}; cancelled with 2 scope(s) not started, 1 of them by ending a task that had not begun; tasks "
        "already started were not cancelled"
    )
    assert sorted(o.outcome for o in report.run.outcomes) == [*["not_started"] * 2, *["submitted"] * 3]
    (cancelled_rack,) = [o for o in report.run.outcomes if o.task_id == unbegun.id]
    assert (cancelled_rack.outcome, cancelled_rack.error) == (
        "not_started",
        f"its rollout was cancelled by rackflow ({why})",
    )
    assert report.task_statuses[running.id] is TaskStatus.RUNNING  # it finishes
    assert report.task_statuses[unbegun.id] is TaskStatus.TERMINATED
    (ended,) = [t for t in await _tasks(env, schedule) if t.id == unbegun.id]
    assert ended.message == f"its rollout was cancelled by rackflow ({why})"
    paused = await env.services.schedules.get(schedule.id)
    assert not paused.enabled and paused.pause is not None
    assert (paused.pause.by, paused.pause.reason) == ("rackflow", why)
    (pause,), _ = await env.services.audit.list_events(EventFilter(method="PauseTaskSchedule"))
    assert (pause.principal, pause.request["reason"]) == ("rackflow", why)
    assert str(report.run.id) in pause.target_ids
    (cancel,), _ = await env.services.audit.list_events(EventFilter(method="CancelTaskScheduleRun"))
    assert (cancel.principal, cancel.request["reason"]) == ("rackflow", report.run.reason)
    assert cancel.target_ids == (str(schedule.id), str(report.run.id))
    told = sorted((e.type, e.reason) for e in await _events(env))
    assert told == sorted([(EventType.RUN_CANCELLED, report.run.reason), (EventType.SCHEDULE_PAUSED, why)])
    await env.services.rollouts.advance()  # nothing more: started, ended, told or audited
    assert (await _run(env, schedule)).run == report.run
    assert len(await _tasks(env, schedule)) == 4
    assert sorted((e.type, e.reason) for e in await _events(env)) == told
    with pytest.raises(FailedPrecondition, match="is cancelled; only a halted rollout can be resumed"):
        await env.services.rollouts.resume(report.run.id)


async def test_a_rollout_halted_before_its_firmware_window_s_end_is_not_resumed_past_it(
    db: Database,
) -> None:
    """A rollout its failures halted waits for an operator's look, past its window's end too (rackflow
    cancels only a rolling one there); a resume then is refused, as it could only be cancelled at its next
    step; a cancel ends it."""
    env = make_env(db)
    racks = await _racks(env, 3)
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    schedule = await _firmware(env, racks, START + timedelta(minutes=70), policy)
    assert len(await env.services.schedules.trigger(schedule.id)) == 1
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    halted = await _run(env, schedule)
    assert (
        halted.run.state == "halted" and halted.run.reason == "rollout halted: 1 of 3 racks failed (limit 1)"
    )
    env.clock.advance(timedelta(minutes=70))

    await env.services.rollouts.advance()

    assert (await _run(env, schedule)).run == halted.run
    with pytest.raises(
        FailedPrecondition,
        match=f"^id: run {halted.run.id} cannot be resumed: its firmware window ended at "
        "2026-03-02T13:10:00Z \\(its upgrade's end_time\\)",
    ):
        await env.services.rollouts.resume(halted.run.id)
    assert (await _run(env, schedule)).run == halted.run
    cancelled = await env.services.rollouts.cancel(halted.run.id)
    assert cancelled.run.state == "cancelled"


async def test_bad_run_ids_and_plain_runs_are_refused(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 1)
    plain = await env.schedule("plain", racks=racks)
    await env.services.schedules.trigger(plain.id)
    run = (await _run(env, plain)).run
    assert run.rollout is None
    with pytest.raises(FailedPrecondition, match="is not a rollout"):
        await env.services.rollouts.resume(run.id)
    with pytest.raises(FailedPrecondition, match="is not a rollout"):
        await env.services.rollouts.cancel(run.id)
    missing = uuid.uuid4()
    for call in (env.services.rollouts.get, env.services.rollouts.resume, env.services.rollouts.cancel):
        with pytest.raises(NotFound, match=f"id: no task schedule run {missing}"):
            await call(missing)


async def test_no_scope_ever_gets_two_tasks_whatever_submits_it(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1))
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    (task,) = await env.services.tasks.get_tasks([task_id])
    async with env.db.transaction() as conn:
        with pytest.raises(AlreadyExists, match="run_id"):
            await task_store.insert_tasks(conn, [replace(task, id=id_beside(task.run_id))])
    # Stepping again and again starts nothing more while the one task runs.
    for _ in range(3):
        assert (await env.services.rollouts.advance()).task_ids == ()
    assert len(await _tasks(env, schedule)) == 1


async def test_the_policy_is_validated_naming_the_field(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 1)
    for policy, field in [
        (RolloutPolicy(max_concurrent_racks=-1), "schedule.rollout.max_concurrent_racks"),
        (RolloutPolicy(max_per_domain=-2), "schedule.rollout.max_per_domain"),
        (RolloutPolicy(canary_racks=-1), "schedule.rollout.canary_racks"),
        (RolloutPolicy(halt_after_failures=-1), "schedule.rollout.halt_after_failures"),
        (RolloutPolicy(halt_after_failure_percent=100.5), "schedule.rollout.halt_after_failure_percent"),
        (RolloutPolicy(bake_time=timedelta(seconds=-1)), "schedule.rollout.bake_time"),
        (RolloutPolicy(bake_time=timedelta(minutes=15)), "schedule.rollout.bake_time"),
    ]:
        with pytest.raises(InvalidArgument, match=f"^{field}: "):
            await _schedule(env, racks, policy)
    assert (await env.services.schedules.list_schedules())[1] == 0


async def test_a_stored_bake_without_canaries_keeps_working_until_its_rollout_changes(db: Database) -> None:
    """Such a policy is refused now (a bake waits after the canaries), but one stored before that must
    still fire and take updates of its other fields; only an update of its rollout must fix it."""
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(canary_racks=1, bake_time=timedelta(minutes=15)))
    legacy = RolloutPolicy(max_concurrent_racks=1, bake_time=timedelta(minutes=15))
    async with db.transaction() as conn:
        await schedule_store.save_schedule(conn, replace(schedule, rollout=legacy))
    renamed = await env.services.schedules.update(schedule.id, ["schedule.name"], name="fw2")
    assert renamed.name == "fw2" and renamed.rollout == legacy
    with pytest.raises(InvalidArgument, match=r"^schedule\.rollout\.bake_time: applies with canary_racks"):
        await env.services.schedules.update(schedule.id, ["schedule.rollout"], rollout=legacy)
    assert len(await env.services.schedules.trigger(schedule.id)) == 1  # one rack at a time, no bake
    assert (await _run(env, schedule)).run.rollout == legacy


async def test_update_sets_and_removes_the_policy(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await env.schedule("s", racks=racks)
    assert schedule.rollout is None
    policy = RolloutPolicy(max_concurrent_racks=1)
    updated = await env.services.schedules.update(schedule.id, ["schedule.rollout"], rollout=policy)
    assert updated.rollout == policy == (await env.services.schedules.get(schedule.id)).rollout
    assert len(await env.services.schedules.trigger(schedule.id)) == 1
    removed = await env.services.schedules.update(schedule.id, ["schedule.rollout"])
    assert removed.rollout is None
    # The run already rolling keeps the policy it fired with.
    assert (await _run(env, schedule)).run.rollout == policy


async def test_pruning_run_history_never_drops_a_live_rollout(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    halted = (await _run(env, schedule)).run
    assert halted.state == "halted"
    await env.services.schedules.resume(schedule.id)
    for _ in range(3):  # dispatched firings while it is halted: each recorded as skipped
        env.clock.advance(timedelta(hours=1))
        async with env.db.transaction() as conn:
            await firing.claim(
                env.db,
                conn,
                [await env.services.schedules.get(schedule.id)],
                trigger="dispatch",
                now=env.clock.now(),
            )
    async with env.db.transaction() as conn:
        await run_history.prune_runs(conn, [schedule.id], keep=1)
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert total == 2 and {r.state for r in runs} == {"halted", "skipped"}
    assert halted.id in {r.id for r in runs}


async def test_the_driver_sleeps_while_nothing_rolls_and_wakes_when_a_rollout_starts(db: Database) -> None:
    """With no run rolling, the driver looks only every `idle_interval` (here a minute); a firing's first
    step wakes it, and it steps every `interval` while the run rolls. The old driver looked every second."""
    env = make_env(db)
    racks = await _racks(env, 3)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1))
    rollouts = env.services.rollouts
    looks: list[Step] = []
    step = rollouts.advance

    async def counted(run_ids: Collection[uuid.UUID] | None = None, limit: int = 20) -> Step:
        done = await step(run_ids, limit)
        if run_ids is None:
            looks.append(done)
        return done

    rollouts.advance = counted  # type: ignore[method-assign]
    driver = RolloutDriver(rollouts, interval=timedelta(milliseconds=50), idle_interval=timedelta(minutes=1))
    stop = asyncio.Event()
    loop = asyncio.create_task(driver.run(stop))
    try:
        await _until(lambda: len(looks) == 1)
        await asyncio.sleep(1.5)
        assert [look.rolling for look in looks] == [False]  # one look, then asleep
        await env.services.schedules.trigger(schedule.id)  # rolling: its first step wakes the driver
        await _until(lambda: len(looks) >= 5)  # and it steps every interval while the run rolls
        assert all(look.rolling for look in looks[1:])
        await _end(env, await _active(env, schedule))
        await _until(lambda: len(_started(looks)) == 1)  # the next rack, started by the driver
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert rollouts.on_rolling == []


def _started(looks: Sequence[Step]) -> list[uuid.UUID]:
    return [task_id for look in looks for task_id in look.task_ids]


async def _until(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
