"""The rollout gate's counts of a run's tasks, taken in SQL (`store.rollouts.run_task_counts`,
`active_by_domain`) rather than read task by task, on both databases: the edges the counting adds to
what the gate counted in Python before, each once: a task its pre-flight checks hold (not in flight, so not
counted against the caps), a task of the claim itself (added one by one by the gate, so not counted
here), a task gone with its deleted rack (no longer present, so the failure bound counts it), a failed
one, and a rack without a domain (a domain of its own)."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from rackflow.checks.gate import GATE_NAME as PREFLIGHT_GATE
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.rollouts.gate import FAILED_STATUSES, failures_at_most
from rackflow.store import rollouts as store
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import set_status
from tests.store.schedules_support import make_env
from tests.store.test_rollouts import _racks, _run, _schedule, _tasks

pytestmark = pytest.mark.asyncio


async def test_the_gate_counts_a_run_s_tasks_as_it_read_them(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 6)
    failed, checked, claimed, counted, alone, deleted = racks
    domain = await env.services.inventory.create_domain(
        "nvl-0", [failed.id, checked.id, claimed.id, counted.id]
    )
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=10))
    await env.services.schedules.trigger(schedule.id)
    run = (await _run(env, schedule)).run
    task_of = {task.rack_id: task for task in await _tasks(env, schedule)}
    assert set(task_of) == {rack.id for rack in racks}
    async with db.transaction() as conn:
        await set_status(
            conn, [task_of[failed.id].id, task_of[deleted.id].id], TaskStatus.FAILED, now=env.clock.now()
        )
        await conn.execute(
            update(tasks).where(tasks.c.id == task_of[checked.id].id).values(held_by=PREFLIGHT_GATE)
        )
    await env.services.inventory.delete_rack(deleted.id)  # its (failed) task goes with it

    async with db.transaction() as conn:
        counts = await store.run_task_counts(
            conn,
            [run.id],
            failed_statuses=FAILED_STATUSES,
            uncounted_holder=PREFLIGHT_GATE,
            deciding={task_of[claimed.id].id},
        )
        by_domain = await store.active_by_domain(
            conn,
            [run.id],
            {domain.id, alone.id, deleted.id},
            uncounted_holder=PREFLIGHT_GATE,
            deciding={task_of[claimed.id].id},
        )
    # Present: all but the deleted rack's; failed: r00 (the deleted rack's failure is no longer there);
    # active against the caps: r03 and r04, not r01 (held by its checks) nor r02 (the claim's own).
    assert counts == {run.id: store.RunTaskCounts(present=5, failed=1, active=2)}
    assert by_domain == {(run.id, domain.id): 1, (run.id, alone.id): 1}
    # The failure bound still counts the deleted rack's task: named by its scope, gone from the run.
    tally = {("submitted", True): 6}
    assert failures_at_most(tally, counts[run.id]) == 2
