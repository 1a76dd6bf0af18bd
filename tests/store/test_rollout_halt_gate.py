"""A halted rollout starts no more racks, on both databases: a task it submitted before the halt that has
not begun (held by a gate, or not claimed yet) stays held by the rollout's gate (`rollouts.gate`) until the
run is resumed; cancelling the run lets it go, as cancel leaves every submitted task be (docs/ROLLOUTS.md).

Here four racks, `max_concurrent_racks` 2 and `halt_after_failures` 1: the first wave is r00 and r01, one
of them fails, and the rollout halts with r02 and r03 not started. Tasks end by writing their status, as
the executor would; `claim` is one executor claim with the start gates.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import timedelta

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tasks import set_status
from rackflow.tasks.gates import consult
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import Env, make_env
from tests.store.test_rollouts import _run
from tests.store.test_rollouts import _schedule as rollout_schedule

OWNER = uuid.uuid4()
HALTING = RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1)


async def claim(env: Env, limit: int = 10, running: Collection[uuid.UUID] = ()) -> list[uuid.UUID]:
    """One executor claim of up to `limit` tasks with the start gates: the tasks that start."""
    async with env.db.transaction() as conn:
        claimed = await task_runs.claim(
            env.db,
            conn,
            owner_id=OWNER,
            lease_ttl=timedelta(seconds=30),
            running_here=running,
            now=env.clock.now(),
            limit=limit,
        )
        gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
    return [task.id for task, _ in gated.claimed]


async def fail_and_step(env: Env, task_id: uuid.UUID) -> None:
    async with env.db.transaction() as conn:
        await set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())
    await env.services.rollouts.advance()


async def get(env: Env, task_id: uuid.UUID) -> Task:
    [task] = await env.services.tasks.get_tasks([task_id])
    return task


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

    await env.services.rollouts.cancel((await _run(env, schedule)).run.id)
    assert await claim(env) == [unclaimed]  # a cancel leaves a submitted task be, at once
