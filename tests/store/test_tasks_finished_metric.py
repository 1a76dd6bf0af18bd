"""`rackflow_tasks_finished_total{status}` (docs/OPERATIONS.md) on both databases: counted once per task
that reaches a final status, by that status, whichever way it got there — run to an end by the executor
(completed, failed), cancelled, or expired in a rack's queue — and not for a cancel that changes nothing."""

from __future__ import annotations

import uuid
from datetime import timedelta

from prometheus_client import REGISTRY

from rackflow.clock import FakeClock
from rackflow.domain.tasks import ConflictStrategy, Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.store.db import Database
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.manager import TaskManager
from tests.store.test_executor import executing, finished, make_rack, submit
from tests.store.test_task_manager import START, start_running
from tests.store.test_task_manager import make_rack as make_fake_clock_rack
from tests.store.test_task_manager import submit as submit_on

POWER_ON = Operation(OperationKind.POWER_ON)


def counts() -> dict[TaskStatus, float]:
    return {
        status: REGISTRY.get_sample_value("rackflow_tasks_finished_total", {"status": status.value}) or 0.0
        for status in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TERMINATED)
    }


def since(before: dict[TaskStatus, float]) -> dict[TaskStatus, float]:
    return {status: value - before[status] for status, value in counts().items()}


async def test_the_executor_counts_completed_and_failed_tasks(db: Database) -> None:
    before = counts()
    rack = await make_rack(db, computes=1)
    failing = SimulatorBackend(SimulatorConfig(step_seconds=0.01, fail_external_ids=frozenset({"gpu-0"})))
    async with executing(db):
        assert (await finished(db, await submit(db, rack, POWER_ON))).status is TaskStatus.COMPLETED
    async with executing(db, failing):
        assert (await finished(db, await submit(db, rack, POWER_ON))).status is TaskStatus.FAILED
    assert since(before) == {TaskStatus.COMPLETED: 1, TaskStatus.FAILED: 1, TaskStatus.TERMINATED: 0}


async def test_a_cancel_and_an_expiry_count_as_terminated(db: Database) -> None:
    clock = FakeClock(START)
    manager = TaskManager(db, clock)
    rack = await make_fake_clock_rack(db, clock)
    running = await submit_on(manager, rack)
    await start_running(db, running, uuid.uuid4())
    queue = QueueOptions(ConflictStrategy.QUEUE, timedelta(seconds=60))
    expiring = await submit_on(manager, rack, POWER_ON, queue)
    cancelled = await submit_on(manager, rack, POWER_ON, QueueOptions(ConflictStrategy.QUEUE))
    before = counts()
    await manager.cancel(cancelled.id)
    await manager.cancel(cancelled.id)  # already terminated: nothing changes, nothing counted
    clock.advance(timedelta(seconds=61))
    await manager.sweep(lease_ttl=timedelta(seconds=15))
    assert [t.status for t in await manager.get_tasks([expiring.id])] == [TaskStatus.TERMINATED]
    assert since(before) == {TaskStatus.COMPLETED: 0, TaskStatus.FAILED: 0, TaskStatus.TERMINATED: 2}
