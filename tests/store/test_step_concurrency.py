"""Steps of one component type run together, up to the backend's `step_concurrency`; types stay in order:
the executor against a backend that records what overlapped, on both databases."""

from __future__ import annotations

import asyncio
import uuid

from rackflow.clock import SystemClock
from rackflow.domain.inventory import Component, ComponentSpec, ComponentType, RackSelection
from rackflow.domain.tasks import (
    ComponentChange,
    ConflictStrategy,
    Operation,
    OperationKind,
    QueueOptions,
    Task,
    TaskStatus,
)
from rackflow.inventory.service import InventoryService
from rackflow.store.db import Database
from rackflow.tasks.backends.base import Backend, StepFailed, StepState
from rackflow.tasks.executor import Executor
from rackflow.tasks.manager import TaskManager

CLOCK = SystemClock()
SHELF = ComponentType.POWERSHELF
NODE = ComponentType.COMPUTE


class Overlapping(Backend):
    """Records which steps were in flight together; fails the components named in `fail`, and notes what
    `notes` says on the steps of the components it names."""

    def __init__(
        self, width: int, fail: frozenset[str] = frozenset(), notes: dict[str, str] | None = None
    ) -> None:
        self.step_concurrency = width
        self.fail = fail
        self.notes = notes or {}
        self.in_flight: dict[str, ComponentType] = {}
        self.peak: dict[ComponentType, int] = {}
        self.started: list[str] = []

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        self.started.append(component.name)
        self.in_flight[component.name] = component.type
        # Anything of another type in flight now would break the power order.
        assert set(self.in_flight.values()) == {component.type}
        self.peak[component.type] = max(self.peak.get(component.type, 0), len(self.in_flight))
        await asyncio.sleep(0.05)
        del self.in_flight[component.name]
        if component.name in self.fail:
            raise StepFailed(f"{component.name} refused")
        note = self.notes.get(component.name)
        return None if note is None else ComponentChange(component.id, note=note)


async def run_task(db: Database, backend: Overlapping, kind: OperationKind) -> Task:
    specs = [ComponentSpec(SHELF, f"ps{i}") for i in range(2)]
    specs += [ComponentSpec(NODE, f"no{i}") for i in range(5)]
    rack = await InventoryService(db, CLOCK).create_rack("r1", components=specs)
    manager = TaskManager(db, CLOCK)
    [task] = await manager.submit(
        Operation(kind), [RackSelection(rack.id)], description="", queue=QueueOptions(ConflictStrategy.REJECT)
    )
    executor = Executor(db, CLOCK, backend, instance_id=uuid.uuid4(), manager=manager, poll_interval=0.02)
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        async with asyncio.timeout(15):
            return await finished(manager, task)
    finally:
        stop.set()
        await runner


async def finished(manager: TaskManager, task: Task) -> Task:
    while True:
        [found] = await manager.get_tasks([task.id])
        if found.status.is_final:
            return found
        await asyncio.sleep(0.02)


async def test_steps_of_one_type_overlap_up_to_the_backend_width(db: Database) -> None:
    backend = Overlapping(width=3)
    done = await run_task(db, backend, OperationKind.POWER_ON)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "powered on 7 components")
    assert backend.peak == {SHELF: 2, NODE: 3}
    assert backend.started[:2] == ["ps0", "ps1"]  # shelves first on power-on


async def test_power_off_runs_the_types_in_reverse(db: Database) -> None:
    backend = Overlapping(width=3)
    await run_task(db, backend, OperationKind.POWER_OFF)
    assert backend.started[-2:] == ["ps0", "ps1"]


async def test_a_failure_ends_the_task_after_its_batch_and_names_every_failed_step(db: Database) -> None:
    backend = Overlapping(width=3, fail=frozenset({"no0", "no2"}))
    done = await run_task(db, backend, OperationKind.POWER_ON)
    assert done.status is TaskStatus.FAILED
    assert done.message == (
        "power_on failed on no0 (3/7): no0 refused; power_on failed on no2 (5/7): no2 refused"
    )
    assert backend.started == ["ps0", "ps1", "no0", "no1", "no2"]  # the next batch never started


async def test_what_steps_note_reaches_the_tasks_message_from_every_batch(db: Database) -> None:
    """A step that succeeded with a note (a restart not observed) is in the message an operator reads."""
    notes = {"ps1": "restart unverified", "no1": "also", "no0": "and this", "no4": "restart unverified too"}
    done = await run_task(db, Overlapping(width=3, notes=notes), OperationKind.POWER_RESET)
    assert (done.status, done.message) == (
        TaskStatus.COMPLETED,
        "reset 7 components; ps1 (2/7): restart unverified; no0 (3/7): and this; no1 (4/7): also; "
        "no4 (7/7): restart unverified too",  # in step order, though steps of a batch end in any order
    )


async def test_a_failed_task_keeps_the_notes_of_the_steps_before(db: Database) -> None:
    backend = Overlapping(width=3, fail=frozenset({"no1"}), notes={"ps0": "restart unverified"})
    done = await run_task(db, backend, OperationKind.POWER_RESET)
    assert (done.status, done.message) == (
        TaskStatus.FAILED,
        "power_reset failed on no1 (4/7): no1 refused; ps0 (1/7): restart unverified",
    )
