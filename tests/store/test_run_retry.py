"""A schedule's retry policy and RetryTaskScheduleRun on both databases: the policy is stored, updated and
carried by the tasks a firing submits; a run that is over is re-fired for its failed and not-started racks
(or all of them) as a new run linked to it, with its own rollout policy; a halted run is cancelled by it;
a run still running or rolling, or with nothing to retry, is refused and nothing is written; a rollout
counts a rack as failed only after its last attempt; and a retry beside the deletion of its schedule comes
wholly before it (answered with its run) or after it (NotFound, nothing submitted)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack, RackSelection
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import QueueOptions, RetryPolicy, Task, TaskStatus
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound
from rackflow.rollouts.service import RunReport, Step
from rackflow.schedules import firing
from rackflow.services import Services
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, make_env, rack_target
from tests.store.test_executor import eventually, executing

pytestmark = pytest.mark.asyncio

RETRY = RetryPolicy(3, timedelta(seconds=30), 2.0, timedelta(minutes=5))


async def _schedule(
    env: Env, racks: Sequence[Rack], *, rollout: RolloutPolicy | None = None, retry: RetryPolicy | None = None
) -> Schedule:
    return await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        rollout=rollout,
        retry=retry,
    )


async def _racks(env: Env, count: int) -> list[Rack]:
    return [await env.rack(f"r{i:02d}") for i in range(count)]


async def _tasks(env: Env, run_id: uuid.UUID) -> list[Task]:
    found, _ = await env.services.tasks.list_tasks()
    return [t for t in found if t.run_id == run_id]


async def _end(env: Env, tasks: Sequence[Task], status: TaskStatus) -> None:
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [t.id for t in tasks], status, now=env.clock.now())


async def _runs(env: Env, schedule: Schedule) -> list[RunReport]:
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    return await env.services.rollouts.reports(runs)


def _rack_names(racks: Sequence[Rack], tasks: Sequence[Task]) -> list[str]:
    by_id = {r.id: r.name for r in racks}
    return sorted(by_id[t.rack_id] for t in tasks)


async def test_the_policy_is_stored_updated_and_carried_by_the_tasks(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 1)
    schedule = await _schedule(env, racks, retry=RETRY)
    assert (await env.services.schedules.get(schedule.id)).retry == RETRY
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    (task,) = await env.services.tasks.get_tasks([task_id])
    assert (task.retry, task.attempt, task.max_attempts) == (RETRY, 1, 3)
    slower = RetryPolicy(5, timedelta(minutes=1), 1.5, timedelta(hours=1))
    updated = await env.services.schedules.update(schedule.id, ["schedule.retry"], retry=slower)
    assert (await env.services.schedules.get(schedule.id)).retry == updated.retry == slower
    removed = await env.services.schedules.update(schedule.id, ["schedule.retry"], retry=None)
    assert removed.retry is None
    (task,) = await env.services.tasks.get_tasks([task_id])
    assert task.retry == RETRY  # a submitted task keeps the policy it was submitted with


async def test_a_bad_policy_names_the_field_and_writes_nothing(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 1)
    bad = RetryPolicy(1, timedelta(seconds=1), 2.0, timedelta(seconds=2))
    with pytest.raises(InvalidArgument, match=r"^schedule\.retry\.max_attempts: must be 2\.\.10, got 1$"):
        await _schedule(env, racks, retry=bad)
    assert (await env.services.schedules.list_schedules())[1] == 0
    schedule = await _schedule(env, racks)
    with pytest.raises(InvalidArgument, match=r"^schedule\.retry\.max_attempts"):
        await env.services.schedules.update(schedule.id, ["schedule.retry"], retry=bad)
    assert (await env.services.schedules.get(schedule.id)).retry is None


async def test_a_finished_run_is_retried_for_its_failed_racks_as_a_linked_run(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 3)
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (first,) = await _runs(env, schedule)
    tasks = sorted(await _tasks(env, first.run.id), key=lambda t: _rack_names(racks, [t]))
    await _end(env, tasks[:1], TaskStatus.COMPLETED)
    await _end(env, tasks[1:2], TaskStatus.FAILED)
    await _end(env, tasks[2:], TaskStatus.TERMINATED)
    env.clock.advance(timedelta(seconds=1))
    again = await env.services.schedules.retry_run(first.run.id)
    assert again.run.retry_of == first.run.id and again.run.trigger == "manual"
    assert _rack_names(racks, await _tasks(env, again.run.id)) == ["r01", "r02"]
    by_id = {r.run.id: r for r in await _runs(env, schedule)}
    assert by_id[first.run.id].retried_by == (again.run.id,)
    # Once those ended, every rack (only_failed false) may be re-run.
    await _end(env, await _tasks(env, again.run.id), TaskStatus.COMPLETED)
    env.clock.advance(timedelta(seconds=1))
    everything = await env.services.schedules.retry_run(first.run.id, only_failed=False)
    assert _rack_names(racks, await _tasks(env, everything.run.id)) == ["r00", "r01", "r02"]


async def test_refusals_name_the_state_and_write_nothing(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (run,) = await _runs(env, schedule)
    with pytest.raises(FailedPrecondition, match=r"^id: run .* still has 2 active task\(s\)"):
        await env.services.schedules.retry_run(run.run.id)
    await _end(env, await _tasks(env, run.run.id), TaskStatus.COMPLETED)
    with pytest.raises(FailedPrecondition, match=r"^id: run .* has no failed or not-started racks left"):
        await env.services.schedules.retry_run(run.run.id)
    with pytest.raises(NotFound, match=r"^id: no task schedule run "):
        await env.services.schedules.retry_run(uuid.uuid4())
    rolling = await _schedule_named(env, racks, "rolling", RolloutPolicy(max_concurrent_racks=1))
    await env.services.schedules.trigger(rolling.id)
    (live,) = await _runs(env, rolling)
    with pytest.raises(FailedPrecondition, match=r"^id: run .* is rolling; only a finished or halted run"):
        await env.services.schedules.retry_run(live.run.id)
    assert len(await _runs(env, schedule)) == 1 and len(await _runs(env, rolling)) == 1


async def _schedule_named(env: Env, racks: Sequence[Rack], name: str, rollout: RolloutPolicy) -> Schedule:
    return await env.services.schedules.create(
        name=name,
        spec=HOURLY,
        overlap_policy=OverlapPolicy.QUEUE,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        rollout=rollout,
    )


HALTING = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)


async def _halted_rollout(env: Env) -> tuple[Schedule, RunReport]:
    """A rollout over three racks (HALTING) whose first rack's task failed, and the step that halted it."""
    schedule = await _schedule(env, await _racks(env, 3), rollout=HALTING)
    await env.services.schedules.trigger(schedule.id)
    (halting,) = await _runs(env, schedule)
    await _end(env, await _tasks(env, halting.run.id), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    return schedule, halting


async def test_a_halted_rollout_is_cancelled_and_its_racks_rolled_out_again(db: Database) -> None:
    env = make_env(db)
    schedule, halting = await _halted_rollout(env)
    assert (await env.services.rollouts.get(halting.run.id)).run.state == "halted"
    # The schedule's policy changed since: the retry rolls out by the run's own.
    await env.services.schedules.update(schedule.id, ["schedule.rollout"], rollout=None)
    env.clock.advance(timedelta(seconds=1))
    again = await env.services.schedules.retry_run(halting.run.id)
    old = await env.services.rollouts.get(halting.run.id)
    assert old.run.state == "cancelled" and "retried by RetryTaskScheduleRun" in old.run.reason
    assert again.run.state == "rolling" and again.run.rollout == HALTING
    assert sorted(o.outcome for o in again.run.outcomes) == ["pending", "pending", "submitted"]
    assert len(again.run.outcomes) == 3  # the failed rack and the two that never started


async def test_a_rollout_counts_a_rack_failed_only_after_its_last_attempt(db: Database) -> None:
    """With the real executor: the first rack's first two steps fail retryably, its third attempt
    succeeds; a halt after one failure never happens, and every rack is rolled out."""
    clock = SystemClock()
    services = Services.build(db, clock)
    specs = [ComponentSpec(ComponentType.COMPUTE, "c", external_id="flaky")]
    first = await services.inventory.create_rack("a-first", components=specs)
    second = await services.inventory.create_rack(
        "b-second", components=[ComponentSpec(ComponentType.COMPUTE, "d")]
    )
    quick = RetryPolicy(3, timedelta(milliseconds=10), 1.0, timedelta(milliseconds=10))
    schedule = await services.schedules.create(
        name="careful",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(first, second),
        rollout=RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1),
        retry=quick,
    )
    await services.schedules.trigger(schedule.id)
    backend = SimulatorBackend(SimulatorConfig(step_seconds=0.005, transient_external_ids={"flaky": 2}))
    async with executing(db, backend):

        async def over() -> bool:
            await services.rollouts.advance()
            runs, _ = await services.schedules.list_runs(schedule.id)
            return runs[0].state != "rolling"

        await eventually(over)
    runs, _ = await services.schedules.list_runs(schedule.id)
    assert runs[0].state == "completed"
    found, _ = await services.tasks.list_tasks(schedule_id=schedule.id)
    by_rack = {t.rack_id: t for t in found}
    assert (by_rack[first.id].status, by_rack[first.id].attempt) == (TaskStatus.COMPLETED, 3)
    assert (by_rack[second.id].status, by_rack[second.id].attempt) == (TaskStatus.COMPLETED, 1)


async def _failed_run(env: Env) -> tuple[Schedule, RunReport, list[Rack]]:
    """A schedule on r00 and r01 fired once, both its tasks failed: its run may be retried."""
    racks = await _racks(env, 2)
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (first,) = await _runs(env, schedule)
    await _end(env, await _tasks(env, first.run.id), TaskStatus.FAILED)
    env.clock.advance(timedelta(seconds=1))
    return schedule, first, racks


async def _tasks_on(env: Env, racks: Sequence[Rack]) -> list[Task]:
    found, _ = await env.services.tasks.list_tasks()
    return [t for t in found if t.rack_id in {r.id for r in racks}]


async def test_a_retry_whose_schedule_is_deleted_before_its_submit_submits_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits between the retry's claim (its new run recorded) and its submit: the run went
    with the schedule, and the retry answers NotFound having submitted nothing (the deletion came first).
    Before, the submit held nothing of the run: it submitted a task per rack for a retry it answered
    NotFound, and the racks were acted on while the operator was told nothing happened."""
    env = make_env(db)
    schedule, first, racks = await _failed_run(env)
    schedules = env.services.schedules
    env.delete_before_its_submit(monkeypatch, schedule)
    before = {t.id for t in await _tasks_on(env, racks)}
    with pytest.raises(NotFound) as gone:
        await schedules.retry_run(first.run.id)
    assert {t.id for t in await _tasks_on(env, racks)} == before  # the first run's two tasks alone
    assert gone.match(r"^id: schedule 'fw' \(.*\) was deleted, with run .* nothing was submitted")


async def test_a_retry_whose_schedule_is_deleted_after_its_submit_answers_with_its_run(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits once the retry's submit did, before its write-back: the retry came first, and
    answers with its run as it was last recorded (the run went with the schedule), naming the tasks it
    submitted, which go on as every task of a deleted schedule does."""
    env = make_env(db)
    schedule, first, racks = await _failed_run(env)
    schedules = env.services.schedules
    write_back = firing._write_back

    async def deleted_first(*args: Any, **kwargs: Any) -> Any:
        await schedules.delete(schedule.id)
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", deleted_first)
    again = await schedules.retry_run(first.run.id)

    # Its write-back came after the deletion and found no run to complete: the run was last recorded
    # "running", as its claim made it. It answered "completed" before, a state no one ever recorded.
    assert (again.run.retry_of, again.run.state, again.run.trigger) == (first.run.id, "running", "manual")
    submitted = [t for t in await _tasks_on(env, racks) if t.id in again.task_statuses]
    assert sorted(o.task_id for o in again.run.outcomes) == sorted(t.id for t in submitted)
    assert _rack_names(racks, submitted) == ["r00", "r01"]
    assert set(again.task_statuses.values()) == {TaskStatus.PENDING}  # not ended by the deletion
    with pytest.raises(NotFound):
        await schedules.get(schedule.id)


def _delete_after_each_step(env: Env, schedule: Schedule, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteSchedule of `schedule` right after each rollout step, its first included (which a retry's
    firing takes once its run is submitted)."""
    rollouts = env.services.rollouts
    advance = rollouts.advance

    async def deleted_after(*args: Any, **kwargs: Any) -> Any:
        step = await advance(*args, **kwargs)
        await env.services.schedules.delete(schedule.id)
        return step

    monkeypatch.setattr(rollouts, "advance", deleted_after)


async def test_a_rollout_s_retry_whose_schedule_is_deleted_after_its_first_step_answers_with_its_run(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout's retry starts its racks in its first step (`RolloutService.advance`), which holds its run;
    DeleteSchedule commits once that step did: the retry came first, and answers with its run as it
    fired, its first wave's rack started, the others still pending."""
    env = make_env(db)
    schedule, halting = await _halted_rollout(env)
    env.clock.advance(timedelta(seconds=1))
    _delete_after_each_step(env, schedule, monkeypatch)
    again = await env.services.schedules.retry_run(halting.run.id)

    assert (again.run.retry_of, again.run.state, again.run.rollout) == (halting.run.id, "rolling", HALTING)
    assert sorted(o.outcome for o in again.run.outcomes) == ["pending", "pending", "submitted"]
    [started] = [o.task_id for o in again.run.outcomes if o.task_id]
    assert again.task_statuses == {started: TaskStatus.PENDING}
    assert again.progress is not None and (again.progress.total, again.progress.pending) == (3, 2)
    with pytest.raises(NotFound):
        await env.services.schedules.get(schedule.id)


async def test_a_retry_whose_schedule_is_deleted_after_its_write_back_answers_it_completed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits once the retry's write-back did, before the retry reads its run for the
    answer: the run was completed, and the answer says so, naming its tasks."""
    env = make_env(db)
    schedule, first, _ = await _failed_run(env)
    schedules = env.services.schedules
    fire = schedules.fire

    async def deleted_after(*args: Any, **kwargs: Any) -> Any:
        results = await fire(*args, **kwargs)
        await schedules.delete(schedule.id)
        return results

    monkeypatch.setattr(schedules, "fire", deleted_after)
    again = await schedules.retry_run(first.run.id)

    assert (again.run.retry_of, again.run.state) == (first.run.id, "completed")
    assert sorted(o.outcome for o in again.run.outcomes) == ["submitted", "submitted"]
    assert set(again.task_statuses.values()) == {TaskStatus.PENDING}


async def test_a_rollout_s_retry_deleted_after_its_first_step_answers_the_run_as_that_step_left_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's first step starts two racks at once, one of which a task of its own blocks: the step
    records that rack "failed" with its conflict, then DeleteSchedule commits. The answer is the run as
    that step recorded it, the failure named. Before, it was rebuilt from the claim, every rack without a
    task still "pending", as though the refused rack were waiting for its turn."""
    env = make_env(db)
    policy = RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1, pause_on_halt=False)
    racks = await _racks(env, 3)
    schedule = await _schedule(env, racks, rollout=policy)
    await env.services.schedules.trigger(schedule.id)
    (halting,) = await _runs(env, schedule)
    first_wave = await _tasks(env, halting.run.id)
    assert _rack_names(racks, first_wave) == ["r00", "r01"]
    await _end(env, [t for t in first_wave if t.rack_id == racks[0].id], TaskStatus.FAILED)
    await _end(env, [t for t in first_wave if t.rack_id == racks[1].id], TaskStatus.COMPLETED)
    await env.services.rollouts.advance()
    assert (await env.services.rollouts.get(halting.run.id)).run.state == "halted"
    [blocker] = await env.services.tasks.submit(
        POWER_OFF, [RackSelection(racks[2].id)], description="busy", queue=QueueOptions()
    )
    env.clock.advance(timedelta(seconds=1))
    _delete_after_each_step(env, schedule, monkeypatch)
    again = await env.services.schedules.retry_run(halting.run.id)

    assert (again.run.retry_of, again.run.state) == (halting.run.id, "rolling")
    by_rack = {o.rack_id: o for o in again.run.outcomes}
    assert set(by_rack) == {racks[0].id, racks[2].id}
    assert by_rack[racks[0].id].outcome == "submitted" and by_rack[racks[0].id].task_id is not None
    assert by_rack[racks[2].id].outcome == "failed" and str(blocker.id) in by_rack[racks[2].id].error
    assert again.progress is not None and (again.progress.failed, again.progress.pending) == (1, 0)


async def test_a_rollout_s_retry_whose_first_step_another_instance_took_before_the_deletion_says_so(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another instance's rollout driver takes the retry's first step (its wave's rack started), then
    DeleteSchedule commits, before the retry's own step, which finds no run. On PostgreSQL the wave's
    task still names the run, and the retry answers with its run and that task. On SQLite the deletion
    cleared the run's id from its tasks, so whether a step started racks cannot be told: the retry
    answers NotFound saying the schedule and run went, that another instance's step may have started
    racks first, and where their tasks are listed. Before, it answered NotFound ("no task schedule
    run") on both, while a rack was being acted on."""
    env = make_env(db)
    schedule, halting = await _halted_rollout(env)
    env.clock.advance(timedelta(seconds=1))
    other = Services.build(db, env.clock)  # another instance, whose driver steps every rolling run
    rollouts = env.services.rollouts
    advance = rollouts.advance
    by_the_other: list[Step] = []

    async def the_other_first_then_deleted(*args: Any, **kwargs: Any) -> Any:
        by_the_other.append(await other.rollouts.advance())
        await env.services.schedules.delete(schedule.id)
        return await advance(*args, **kwargs)

    monkeypatch.setattr(rollouts, "advance", the_other_first_then_deleted)
    if db.is_sqlite:
        with pytest.raises(NotFound) as gone:
            await env.services.schedules.retry_run(halting.run.id)
        assert gone.match(
            rf"^id: schedule 'fw' \({schedule.id}\) was deleted, with run .*, before this call's step of its "
            r"rollout: a rollout driver's step may have started racks of it first; their tasks go on "
            rf"\(rackflow task list --schedule {schedule.id}\)$"
        )
    else:
        again = await env.services.schedules.retry_run(halting.run.id)
        ((started,),) = [step.task_ids for step in by_the_other]
        assert (again.run.retry_of, again.run.state) == (halting.run.id, "rolling")
        assert [o.task_id for o in again.run.outcomes if o.task_id] == [started]
        assert again.task_statuses == {started: TaskStatus.PENDING}
    (step,) = by_the_other
    assert len(step.task_ids) == 1  # a rack was started
