"""A halted rollout starts no more racks, on both databases: a task it submitted before the halt that has
not begun (held by a gate, or not claimed yet) stays held by the rollout's gate (`rollouts.gate`) until the
run is resumed; cancelling the run (or retrying it, which cancels it) ends such a task, TERMINATED, its rack
not started, and leaves a task that began be (docs/ROLLOUTS.md).

Here four racks, `max_concurrent_racks` 2 and `halt_after_failures` 1: the first wave is r00 and r01, one
of them fails, and the rollout halts with r02 and r03 not started. Tasks end by writing their status, as
the executor would; `claim` is one executor claim with the start gates.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.budgets.service import BudgetInput
from rackflow.domain.inventory import Component
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import ComponentChange, Fail, OperationKind, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.rollouts.gate import CANCELLED_REASON
from rackflow.store import outbox, task_runs
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import set_status
from rackflow.tasks.backends.base import Backend, StepState
from rackflow.tasks.executor import Executor
from rackflow.tasks.gates import consult
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import Env, make_env
from tests.store.test_approvals import caller
from tests.store.test_executor import eventually
from tests.store.test_rollouts import _run
from tests.store.test_rollouts import _schedule as rollout_schedule

OWNER = uuid.uuid4()
HALTING = RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1)


async def claim_in(
    env: Env, conn: AsyncConnection, *, limit: int = 10, running: Collection[uuid.UUID] = ()
) -> list[tuple[Task, int]]:
    """The executor's claim of up to `limit` tasks in `conn`, by OWNER (an instance that is not live), its
    gates not yet asked: the tasks it took, with their attempts."""
    return await task_runs.claim(
        env.db,
        conn,
        owner_id=OWNER,
        lease_ttl=timedelta(seconds=30),
        running_here=running,
        now=env.clock.now(),
        limit=limit,
    )


async def claim(env: Env, limit: int = 10, running: Collection[uuid.UUID] = ()) -> list[uuid.UUID]:
    """One executor claim of up to `limit` tasks with the start gates: the tasks that start."""
    async with env.db.transaction() as conn:
        claimed = await claim_in(env, conn, running=running, limit=limit)
        gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
    return [task.id for task, _ in gated.claimed]


async def fail_and_step(env: Env, task_id: uuid.UUID) -> None:
    async with env.db.transaction() as conn:
        await set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())
    await env.services.rollouts.advance()


async def get(env: Env, task_id: uuid.UUID) -> Task:
    [task] = await env.services.tasks.get_tasks([task_id])
    return task


def assert_ended_by_the_cancel(task: Task, by: str) -> None:
    assert (task.status, task.message, task.started_at) == (
        TaskStatus.TERMINATED,
        f"its rollout was cancelled by {by}",
        None,
    )


def assert_held_by_the_halt(task: Task) -> None:
    assert (task.status, task.held_by, task.started_at) == (TaskStatus.PENDING, "rollout", None)
    assert (task.held_reason or "").startswith("waits for its rollout to be resumed: rollout halted: 1 of 4")


async def test_a_rack_a_gate_held_when_its_rollout_halted_waits_for_the_resume(db: Database) -> None:
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(4)]
    now = env.clock.now()
    freeze = OneOff(now - timedelta(seconds=1), now + timedelta(seconds=10))
    await env.services.windows.create(
        WindowInput(name="short", kind=WindowKind.FREEZE, when=freeze, racks=(Ref(id=racks[0].id),))
    )
    schedule = await rollout_schedule(env, racks, HALTING)
    frozen, running = await env.services.schedules.trigger(schedule.id)
    assert await claim(env) == [running]  # r00 held by the freeze
    await fail_and_step(env, running)
    assert (await _run(env, schedule)).run.state == "halted"

    env.clock.advance(timedelta(seconds=11))  # the freeze is over; the rollout is halted
    assert await claim(env) == [], "a rack of the halted rollout started"
    assert_held_by_the_halt(await get(env, frozen))

    report = await env.services.rollouts.resume((await _run(env, schedule)).run.id)
    [r02] = [o.task_id for o in report.run.outcomes if o.rack_id == racks[2].id]
    assert sorted(map(str, await claim(env))) == sorted(map(str, [frozen, r02]))  # at once: released


async def test_racks_a_budget_holds_halt_their_rollout_though_none_waits_its_turn(db: Database) -> None:
    """ROLLOUTS.md, "A rollout under a budget": a rollout whose caps let every rack be submitted at once has
    no rack waiting its turn, but a budget lets one run at a time; when that one fails past the limit, the
    rollout halts and the racks the budget held start no more (the halt holds them), rather than let a bad
    image reach every rack behind the budget. (It completed instead: no rack was `pending`.)"""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(3)]
    await env.services.budgets.create(BudgetInput("one-off", (OperationKind.POWER_OFF,), 1))
    schedule = await rollout_schedule(env, racks, RolloutPolicy(halt_after_failures=1))
    submitted = await env.services.schedules.trigger(schedule.id)
    assert len(submitted) == 3  # every rack at once: none waits its turn
    [running] = await claim(env)  # the budget lets one start
    await fail_and_step(env, running)

    report = await _run(env, schedule)
    halted = ("halted", "rollout halted: 1 of 3 racks failed (limit 1)")
    assert (report.run.state, report.run.reason) == halted
    env.clock.advance(timedelta(minutes=10))  # the budget has room now; the rollout is halted
    for _ in range(2):  # the budget admits one at a claim: the rollout's gate holds it
        assert await claim(env) == [], "a rack the budget held started after its rollout's failure limit"
        env.clock.advance(timedelta(minutes=10))
    held = [await get(env, task_id) for task_id in set(submitted) - {running}]
    assert {(t.status, t.started_at) for t in held} == {(TaskStatus.PENDING, None)}
    assert "rollout" in {t.held_by for t in held}  # the one the budget lets go each time: the other waits
    assert (await env.services.schedules.get(schedule.id)).pause is not None  # paused on the halt


async def test_a_rack_a_budget_lets_go_before_the_step_halts_its_rollout_does_not_start(db: Database) -> None:
    """The failure that reaches the limit frees the budget's room, and an executor's claim may come before
    the rollout's next step (a second apart) halts the run: the rollout's gate, which a task a budget held
    comes before, finds the limit reached and holds it until that step, rather than start one rack more
    after the failure limit. (It started it: the gate counted only the caps.)"""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(3)]
    await env.services.budgets.create(BudgetInput("one-off", (OperationKind.POWER_OFF,), 1))
    schedule = await rollout_schedule(env, racks, RolloutPolicy(halt_after_failures=1))
    submitted = await env.services.schedules.trigger(schedule.id)
    [running] = await claim(env)
    async with env.db.transaction() as conn:  # it fails; no step has seen it yet
        await set_status(conn, [running], TaskStatus.FAILED, now=env.clock.now())
    env.clock.advance(timedelta(minutes=1))  # the budget's back-off is over

    assert await claim(env) == [], "a rack started after its rollout reached its failure limit"
    held = [await get(env, task_id) for task_id in set(submitted) - {running}]
    assert "rollout" in {t.held_by for t in held}
    await env.services.rollouts.advance()
    assert (await _run(env, schedule)).run.state == "halted"
    env.clock.advance(timedelta(minutes=10))
    assert await claim(env) == []


async def test_a_failure_whose_task_went_with_its_rack_still_holds_a_rack_a_budget_lets_go(
    db: Database,
) -> None:
    """The gate runs the rollout rule only for a run whose failures could reach its limit, counted from the
    run's tally and its tasks without reading its outcomes; a failed rack deleted since (its tasks with it)
    leaves no failed task to count, yet the rule counts its scope failed (its task is gone), so the bound
    counts the run's tasks that are gone as failures. (A bound that counted failed tasks alone let the
    next rack start: no failed task, so no look.)"""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(3)]
    await env.services.budgets.create(BudgetInput("one-off", (OperationKind.POWER_OFF,), 1))
    schedule = await rollout_schedule(env, racks, RolloutPolicy(halt_after_failures=1))
    submitted = await env.services.schedules.trigger(schedule.id)
    [running] = await claim(env)
    async with env.db.transaction() as conn:  # it fails; no step has seen it yet
        await set_status(conn, [running], TaskStatus.FAILED, now=env.clock.now())
    await env.services.inventory.delete_rack((await get(env, running)).rack_id)  # its task goes with it
    env.clock.advance(timedelta(minutes=1))  # the budget's back-off is over

    assert await claim(env) == [], "a rack started after its rollout reached its failure limit"
    held = [await get(env, task_id) for task_id in set(submitted) - {running}]
    assert "rollout" in {t.held_by for t in held}
    await env.services.rollouts.advance()
    assert (await _run(env, schedule)).run.state == "halted"


async def test_a_rack_not_claimed_yet_when_its_rollout_halted_waits_too(db: Database) -> None:
    """Nothing held it (the executors were busy): the halt routes it through the gate all the same."""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(4)]
    schedule = await rollout_schedule(env, racks, HALTING)
    first_wave = await env.services.schedules.trigger(schedule.id)
    [running] = await claim(env, limit=1)
    [unclaimed] = [t for t in first_wave if t != running]
    await fail_and_step(env, running)

    assert_held_by_the_halt(await get(env, unclaimed))
    env.clock.advance(timedelta(minutes=10))  # however long it stays halted
    assert await claim(env) == [], "a rack of the halted rollout started"
    assert_held_by_the_halt(await get(env, unclaimed))

    with caller("oncall"):
        report = await env.services.rollouts.cancel((await _run(env, schedule)).run.id)
    assert_ended_by_the_cancel(await get(env, unclaimed), "oncall")
    env.clock.advance(timedelta(minutes=10))
    assert await claim(env) == [], "a rack of the cancelled rollout started"
    [outcome] = [o for o in report.run.outcomes if o.task_id == unclaimed]
    assert (outcome.outcome, outcome.error) == ("not_started", "its rollout was cancelled by oncall")
    assert report.progress is not None
    assert (report.progress.not_started, report.progress.failed, report.progress.active) == (3, 1, 0)
    assert "3 scope(s) not started, 1 of them by ending a task that had not begun" in report.run.reason
    async with env.db.read() as conn:
        [cleared, *_] = await outbox.list_events(conn, 10)
    assert cleared.summary == "halted rollout cancelled; 1 task(s) that had not begun ended"
    assert not (await env.services.schedules.get(schedule.id)).enabled  # the halt's pause stays


async def test_a_cancel_ends_a_rack_another_gate_holds_and_leaves_a_running_one_be(db: Database) -> None:
    """A rolling rollout cancelled: its rack a freeze holds is ended, its running rack goes on, and so does
    a rack whose retry's next attempt waits its back-off (it began)."""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(4)]
    now = env.clock.now()
    freeze = OneOff(now - timedelta(seconds=1), now + timedelta(hours=1))
    await env.services.windows.create(
        WindowInput(name="long", kind=WindowKind.FREEZE, when=freeze, racks=(Ref(id=racks[0].id),))
    )
    schedule = await rollout_schedule(env, racks, RolloutPolicy(max_concurrent_racks=3))
    frozen, running, retrying = await env.services.schedules.trigger(schedule.id)
    assert sorted(map(str, await claim(env))) == sorted(map(str, [running, retrying]))
    assert (await get(env, frozen)).held_by == "freeze"
    async with env.db.transaction() as conn:  # its first attempt failed: the next waits its back-off
        await conn.execute(
            update(tasks)
            .where(tasks.c.id == retrying)
            .values(status=TaskStatus.PENDING.value, owner_id=None, attempt=2, held_by="retry")
        )

    await env.services.rollouts.cancel((await _run(env, schedule)).run.id)
    assert_ended_by_the_cancel(await get(env, frozen), "anonymous")
    assert (await get(env, frozen)).held_by is None  # ended: nothing holds it, not the freeze either
    assert (await get(env, running)).status is TaskStatus.RUNNING
    assert (await get(env, retrying)).status is TaskStatus.PENDING
    env.clock.advance(timedelta(hours=2))  # the freeze is over
    assert await claim(env, running=[running]) == [retrying]  # its next attempt, and nothing else


@pytest.mark.postgres
async def test_a_task_a_claim_took_while_its_rollout_was_cancelled_is_ended_by_the_gate(pg_db: str) -> None:
    """The cancel skips a task a claim holds (it waits on no claim: the claim waits for the run's row);
    that claim's rollout gate, which reads the run once the cancel committed, ends it, and its rack's
    outcome says it did not start, as the cancel's others say (its counts too). The cancel's reason and
    its halt's clearing count it as left to that gate, not as ended nor as started. (PostgreSQL only:
    SQLite's single writer opens no claim beside the cancel's transaction.)"""
    db = Database(pg_db)
    try:
        await _cancel_beside_an_open_claim(make_env(db))
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_takeover_of_a_task_the_gate_ended_for_its_cancelled_rollout_ends_it(pg_db: str) -> None:
    """The claim whose rollout gate ended the task commits, and its instance dies before its executor
    records the end: the task is RUNNING, its owner's lease gone, its rack "not_started" in the run.
    Another executor takes it over (a second claim, which the start gates do not look at: it began) and
    ends it as the gate did, rather than run it."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        ended = await _cancel_beside_an_open_claim(env)
        assert (await get(env, ended)).status is TaskStatus.RUNNING  # its owner never ended it: it died
        backend = Recording()
        executor = Executor(
            env.db, env.clock, backend, instance_id=uuid.uuid4(), gates=env.services.gates, poll_interval=0.05
        )
        stop = asyncio.Event()
        running = asyncio.create_task(executor.run(stop))
        try:

            async def over() -> bool:
                return (await get(env, ended)).status.is_final

            await eventually(over)
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
        task = await get(env, ended)
        assert (task.status, task.message) == (TaskStatus.TERMINATED, CANCELLED_REASON)
        assert backend.steps == []
        report = await env.services.rollouts.get(task.run_id or uuid.uuid4())
        [outcome] = [o for o in report.run.outcomes if o.task_id == ended]
        assert (outcome.outcome, outcome.error) == ("not_started", CANCELLED_REASON)
    finally:
        await db.dispose()


class Recording(Backend):
    """A backend that only records the steps asked of it."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        self.steps.append(component.name)
        return None


async def _cancel_beside_an_open_claim(env: Env) -> uuid.UUID:
    """The test above, up to its claim's commit; the task that claim's rollout gate ended (and that the
    claim, owned by no live instance, leaves RUNNING)."""
    racks = [await env.rack(f"r{i:02d}") for i in range(4)]
    schedule = await rollout_schedule(env, racks, HALTING)
    first_wave = await env.services.schedules.trigger(schedule.id)
    [running] = await claim(env, limit=1)
    [unclaimed] = [t for t in first_wave if t != running]
    await fail_and_step(env, running)
    env.clock.advance(timedelta(minutes=2))  # the halt's hold is due for a look again

    async with env.db.transaction() as conn:
        claimed = await claim_in(env, conn)
        assert [task.id for task, _ in claimed] == [unclaimed]
        report = await env.services.rollouts.cancel((await _run(env, schedule)).run.id)
        assert report.task_statuses[unclaimed] is TaskStatus.PENDING  # skipped: the claim holds it
        assert report.run.reason.endswith(
            "cancelled with 2 scope(s) not started, 0 of them by ending a task that had not begun; "
            "1 task(s) an executor was claiming left to its start gate; "
            "tasks already started were not cancelled"
        )
        async with env.db.read() as read:
            [cleared, *_] = await outbox.list_events(read, 10)
        assert cleared.summary == (
            "halted rollout cancelled; 1 task(s) an executor was claiming left to its start gate"
        )
        gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
    assert gated.failed == {unclaimed: Fail(CANCELLED_REASON, ends_as=TaskStatus.TERMINATED)}
    report = await env.services.rollouts.get(report.run.id)
    [outcome] = [o for o in report.run.outcomes if o.task_id == unclaimed]
    assert (outcome.outcome, outcome.error) == ("not_started", CANCELLED_REASON)
    assert report.progress is not None
    assert (report.progress.not_started, report.progress.active) == (3, 0)
    tally = (await env.services.rollouts.summary(report.run.id)).tally  # the kept counts agree
    assert tally == {("submitted", True): 1, ("not_started", True): 1, ("not_started", False): 2}
    return unclaimed


async def test_a_retry_of_a_halted_rollout_ends_its_tasks_that_had_not_begun(db: Database) -> None:
    """Its not-started racks, the one whose task the halt held included, are rolled out by the new run
    alone: one task per rack, and the new run's tasks start."""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(4)]
    schedule = await rollout_schedule(env, racks, HALTING)
    first_wave = await env.services.schedules.trigger(schedule.id)
    [running] = await claim(env, limit=1)
    [unclaimed] = [t for t in first_wave if t != running]
    async with env.db.transaction() as conn:  # as its executor ends it, letting go of its rack
        await task_runs.finish(
            conn, {running: (TaskStatus.FAILED, "boom")}, owner_id=OWNER, now=env.clock.now()
        )
    await env.services.rollouts.advance()
    halted = (await _run(env, schedule)).run.id

    again = await env.services.schedules.retry_run(halted)
    assert_ended_by_the_cancel(await get(env, unclaimed), "anonymous (retried by RetryTaskScheduleRun)")
    old = await env.services.rollouts.get(halted)
    assert old.run.state == "cancelled"
    assert sorted(o.outcome for o in old.run.outcomes) == ["not_started"] * 3 + ["submitted"]
    assert len(again.run.outcomes) == 4  # the failed rack and the three that never started
    new_wave = [o.task_id for o in again.run.outcomes if o.task_id is not None]
    assert len(new_wave) == 2
    assert sorted(map(str, await claim(env))) == sorted(map(str, new_wave))
    found, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    active = [t.rack_id for t in found if t.status.is_active]
    assert len(active) == len(set(active)) == 2  # one task per rack
