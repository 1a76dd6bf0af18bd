"""The freeze gate at task start, with the real executor on both databases: a manual task waits for the
freeze to end, the override starts it anyway, a running task is not interrupted, and changing the freeze
lets its tasks go."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from rackflow.clock import SystemClock
from rackflow.domain.inventory import RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.tasks.gates import consult
from rackflow.windows.gate import FreezeGate
from rackflow.windows.service import WindowInput
from tests.store.test_executor import eventually, executing, finished, get, make_rack

CLOCK = SystemClock()
POWER_ON = Operation(OperationKind.POWER_ON)


async def freeze(
    services: Services, *, hours: float = 1, operations: tuple[OperationKind, ...] = ()
) -> uuid.UUID:
    now = CLOCK.now()
    window = await services.windows.create(
        WindowInput(
            name="launch-week",
            kind=WindowKind.FREEZE,
            when=OneOff(now - timedelta(hours=1), now + timedelta(hours=hours)),
            operations=operations,
        )
    )
    return window.id


async def submit(services: Services, rack_id: uuid.UUID, *, ignore: bool = False) -> Task:
    (task,) = await services.tasks.submit(
        POWER_ON, [RackSelection(rack_id)], description="by hand", queue=QueueOptions(ignore_windows=ignore)
    )
    return task


async def held(db: Database, task: Task) -> Task:
    """The task once the executor has looked at it and handed it back."""

    async def handed_back() -> bool:
        return (await get(db, task)).message.startswith("waits for freeze")

    await eventually(handed_back)
    return await get(db, task)


async def test_a_freeze_holds_a_manual_task_until_it_is_deleted(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    window_id = await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        waiting = await held(db, task)
        assert waiting.status is TaskStatus.PENDING
        assert waiting.message.startswith("waits for freeze 'launch-week' to end at ")
        assert waiting.not_before is not None and waiting.not_before > CLOCK.now()
        assert waiting.started_at is None
        await asyncio.sleep(0.3)  # several polls: still held, never started
        assert (await get(db, task)).status is TaskStatus.PENDING
        await services.windows.delete(window_id)
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED


async def test_the_override_starts_a_task_inside_a_freeze(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    await freeze(services)
    task = await submit(services, rack.id, ignore=True)
    assert task.ignore_windows
    async with executing(db):
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED


async def test_a_freeze_for_other_operations_does_not_hold(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    await freeze(services, operations=(OperationKind.UPGRADE_FIRMWARE,))
    task = await submit(services, rack.id)
    async with executing(db):
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


async def test_shortening_a_freeze_lets_its_tasks_start(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    window_id = await freeze(services, hours=5)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
        now = CLOCK.now()
        await services.windows.update(
            window_id, ["window.when"], WindowInput(when=OneOff(now - timedelta(hours=1), now))
        )
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


async def test_a_running_task_is_not_held(db: Database) -> None:
    """Only first attempts are gated: a task taken over (attempt 2) was running before the freeze."""
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    await freeze(services)
    task = await submit(services, rack.id)
    owner = uuid.uuid4()
    async with db.transaction() as conn:
        claimed = await task_runs.claim(
            db,
            conn,
            owner_id=owner,
            lease_ttl=timedelta(seconds=15),
            running_here=(),
            now=CLOCK.now(),
            limit=5,
        )
        assert [(t.id, attempt) for t, attempt in claimed] == [(task.id, 1)]
        taken_over = [(t, 2) for t, _ in claimed]
        gates = [FreezeGate()]
        assert (await consult(gates, conn, taken_over, owner_id=owner, now=CLOCK.now())).claimed == taken_over
        assert (await consult(gates, conn, claimed, owner_id=owner, now=CLOCK.now())).claimed == []
    assert (await get(db, task)).status is TaskStatus.PENDING
