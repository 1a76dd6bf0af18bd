"""A halt and a resume beside an executor's claim of the same run's tasks do not deadlock (PostgreSQL:
SQLite's single writer opens no claim beside them).

Rows are locked a task's before its run's: the claim locks its tasks, then its rollout gate locks their runs
(`rollouts.gate`). A halt (a rollout step) and a resume lock the run first; were they to wait then for a
task the claim holds, each would wait for the other and PostgreSQL would abort one. They skip such a task
instead (`store.tasks.unclaimed`), and the claim's rollout gate decides it from the run they left.

Here four racks, `halt_after_failures` 1; each test opens the claim, lets the halt or resume run beside it
until it is done or waits on a lock, then has the claim's gates lock the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

import pytest
from sqlalchemy import text, update

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import Hold, TaskStatus
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import hold_values, set_status
from rackflow.tasks.gates import consult
from tests.store.schedules_support import Env, make_env
from tests.store.test_rollout_halt_gate import HALTING, OWNER, claim, claim_in, fail_and_step, get
from tests.store.test_rollouts import _run
from tests.store.test_rollouts import _schedule as rollout_schedule

pytestmark = pytest.mark.postgres

T = TypeVar("T")


# A lock some session of this test's database waits for (not another test's, on the same server).
_WAITING = text(
    "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid)"
    " WHERE NOT granted AND datname = current_database()"
)


async def done_or_waiting_on_a_lock(env: Env, beside: asyncio.Future[T]) -> None:
    """Until `beside` is done, or its transaction waits for a row lock (the claim's)."""
    async with asyncio.timeout(60):
        while not beside.done():
            async with env.db.read() as conn:
                waiting = await conn.scalar(_WAITING)
            if waiting:
                return
            await asyncio.sleep(0.05)


async def open_claim_then_gate(env: Env, expected: list[object], beside: Awaitable[T]) -> tuple[T, object]:
    """Claim (locking the tasks), run `beside` until it is done or waits, then consult the gates (locking
    the run): both must end, neither aborted as a deadlock."""
    async with env.db.transaction() as conn:
        claimed = await claim_in(env, conn)
        assert sorted(str(task.id) for task, _ in claimed) == sorted(map(str, expected))
        other = asyncio.ensure_future(beside)
        await done_or_waiting_on_a_lock(env, other)
        gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
    return await asyncio.wait_for(other, 60), gated


async def test_a_resume_beside_a_claim_of_a_task_its_halt_held(pg_db: str) -> None:
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack(f"r{i:02d}") for i in range(4)]
        schedule = await rollout_schedule(env, racks, HALTING)
        first_wave = await env.services.schedules.trigger(schedule.id)
        [running] = await claim(env, limit=1)
        [held] = [t for t in first_wave if t != running]
        await fail_and_step(env, running)
        assert (await get(env, held)).held_by == "rollout"
        env.clock.advance(timedelta(minutes=2))  # the halt's hold is due for a look again: claimed
        run_id = (await _run(env, schedule)).run.id

        report, gated = await open_claim_then_gate(env, [held], env.services.rollouts.resume(run_id))
        assert report.run.state == "rolling"
        assert [task.id for task, _ in gated.claimed] == [held]  # the gate let it go on, under the caps
    finally:
        await db.dispose()


async def test_a_halt_beside_a_claim_of_the_run_s_tasks(pg_db: str) -> None:
    """The claim holds r00 (a freeze held it: its rollout gate locks the run) and another rack's task that
    nothing held; the rollout step halts the run meanwhile."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack(f"r{i:02d}") for i in range(4)]
        policy = RolloutPolicy(max_concurrent_racks=3, halt_after_failures=1)
        schedule = await rollout_schedule(env, racks, policy)
        frozen, *others = await env.services.schedules.trigger(schedule.id)
        async with env.db.transaction() as conn:  # as the freeze gate holds it, for ten seconds
            hold = Hold(env.clock.now() + timedelta(seconds=10), "waits for freeze 'short' to end")
            held = update(tasks).where(tasks.c.id == frozen)
            await conn.execute(held.values(hold_values("freeze", hold, env.clock.now())))
        [failing] = await claim(env, limit=1)
        [fresh] = [t for t in others if t != failing]
        async with env.db.transaction() as conn:
            await set_status(conn, [failing], TaskStatus.FAILED, now=env.clock.now())
        env.clock.advance(timedelta(seconds=11))  # the freeze is over

        step, gated = await open_claim_then_gate(env, [frozen, fresh], env.services.rollouts.advance())
        assert step.runs == 1
        assert (await _run(env, schedule)).run.state == "halted"
        assert [task.id for task, _ in gated.claimed] == [fresh]  # claimed before the halt: it began first
        assert (await get(env, frozen)).held_by == "rollout"
    finally:
        await db.dispose()
