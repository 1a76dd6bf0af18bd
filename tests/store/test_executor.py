"""The executor with the simulator backend, on SQLite and PostgreSQL, at tiny step durations."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, Uuid, event, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.clock import FakeClock, SystemClock
from rackflow.domain.inventory import Component, ComponentSpec, ComponentType, PowerState, Rack, RackSelection
from rackflow.domain.tasks import (
    ComponentChange,
    ConflictStrategy,
    Operation,
    OperationKind,
    QueueOptions,
    Task,
    TaskStatus,
)
from rackflow.errors import InvalidArgument, Unavailable
from rackflow.inventory.service import InventoryService
from rackflow.services import Services
from rackflow.store import instances, task_runs
from rackflow.store.db import Database
from rackflow.store.tables import instances as instances_table
from rackflow.store.tables import tasks as tasks_table
from rackflow.tasks.backends.base import Backend, StepState
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.executor import MAX_ATTEMPTS, Executor
from rackflow.tasks.manager import CANCELLED_MESSAGE, TaskManager

CLOCK = SystemClock()
FAST = SimulatorConfig(step_seconds=0.01)
REJECT = QueueOptions(ConflictStrategy.REJECT)
QUEUE = QueueOptions(ConflictStrategy.QUEUE)


async def make_rack(db: Database, computes: int = 3) -> Rack:
    specs = [
        ComponentSpec(ComponentType.COMPUTE, f"compute-{i}", external_id=f"gpu-{i}", firmware_version="1.0")
        for i in range(computes)
    ]
    specs += [
        ComponentSpec(ComponentType.POWERSHELF, "shelf-0", external_id="shelf-0"),
        ComponentSpec(ComponentType.NVSWITCH, "switch-0", external_id="switch-0"),
    ]
    return await InventoryService(db, CLOCK).create_rack("r1", components=specs)


async def submit(db: Database, rack: Rack, operation: Operation, queue: QueueOptions = REJECT) -> Task:
    [task] = await TaskManager(db, CLOCK).submit(
        operation, [RackSelection(rack.id)], description="", queue=queue
    )
    return task


async def get(db: Database, task: Task) -> Task:
    [found] = await TaskManager(db, CLOCK).get_tasks([task.id])
    return found


async def row(db: Database, task: Task) -> Any:
    async with db.read() as conn:
        return (await conn.execute(select(tasks_table).where(tasks_table.c.id == task.id))).one()


async def components(db: Database, rack: Rack) -> dict[str, Component]:
    return {c.name: c for c in (await InventoryService(db, CLOCK).get_rack(rack.id)).components}


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll `check` until it holds (at most 15 s)."""
    async with asyncio.timeout(15):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def finished(db: Database, task: Task) -> Task:
    async def done() -> bool:
        return (await get(db, task)).status.is_final

    await eventually(done)
    return await get(db, task)


@asynccontextmanager
async def executing(db: Database, backend: Any = None, **options: Any) -> AsyncIterator[Executor]:
    options = {
        "poll_interval": 0.05,
        "lease_ttl": 1.0,
        "instance_id": uuid.uuid4(),
        "gates": Services.build(db, CLOCK).gates,  # as `rackflow serve` registers them
        **options,
    }
    executor = Executor(db, CLOCK, backend or SimulatorBackend(FAST), **options)
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        yield executor
    finally:
        stop.set()
        await asyncio.wait_for(runner, 10)


async def start_running(
    db: Database, task: Task, owner: uuid.UUID, *, attempts: int = 1, heartbeat_age: timedelta | None = None
) -> None:
    """Make `task` RUNNING under `owner`, whose heartbeat is `heartbeat_age` old (None: not registered)."""
    async with db.transaction() as conn:
        now = await db.now(conn)
        await task_runs.mark_running(conn, task.id, owner_id=owner, now=now)
        await conn.execute(update(tasks_table).where(tasks_table.c.id == task.id).values(attempts=attempts))
        if heartbeat_age is not None:
            await conn.execute(
                insert(instances_table).values(
                    id=owner,
                    host="gone",
                    pid=1,
                    started_at=now - heartbeat_age,
                    heartbeat_at=now - heartbeat_age,
                )
            )


class Recording(Backend):
    """A backend that records the component order and delegates to the simulator."""

    def __init__(self, inner: SimulatorBackend) -> None:
        self.inner = inner
        self.steps: list[str] = []

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        self.steps.append(component.name)
        return await self.inner.run_step(task, component, state)


class Pausing(Backend):
    """The simulator's quick steps, each recorded as it starts; the `at`-th waits until `go` is set."""

    def __init__(self, at: int) -> None:
        self.inner = SimulatorBackend(FAST)
        self.at = at
        self.started: list[str] = []
        self.go = asyncio.Event()

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        self.started.append(component.name)
        if len(self.started) == self.at:
            await self.go.wait()
        return await self.inner.run_step(task, component, state)

    async def paused(self) -> bool:
        return len(self.started) == self.at


@contextmanager
def task_row_writes(db: Database, task_id: uuid.UUID) -> Iterator[list[str]]:
    """The UPDATEs of `tasks` that name the task (in a WHERE or a CASE) while the block runs: each writes a
    new version of its row while the task is the writer's. (A claim names the tasks running here only to
    pass them over: `running_here`, each value of that list a parameter of its own, `running_here_1`, ….)"""
    writes: list[str] = []

    def names_it(name: str, value: object) -> bool:
        return value == task_id and not name.startswith("running_here")

    def count(
        _conn: object, _cursor: object, statement: str, _params: object, context: Any, _many: bool
    ) -> None:
        if not statement.startswith("UPDATE tasks "):
            return
        if any(
            names_it(name, value) for params in context.compiled_parameters for name, value in params.items()
        ):
            writes.append(statement)

    event.listen(db.engine.sync_engine, "after_cursor_execute", count)
    try:
        yield writes
    finally:
        event.remove(db.engine.sync_engine, "after_cursor_execute", count)


_VERSIONS = Table("test_task_row_versions", MetaData(), Column("task_id", Uuid(), nullable=False))
_COUNT_VERSIONS = {
    "sqlite": [
        "CREATE TRIGGER test_task_row_versions AFTER UPDATE ON tasks"
        " BEGIN INSERT INTO test_task_row_versions (task_id) VALUES (NEW.id); END"
    ],
    "postgresql": [
        "CREATE FUNCTION test_task_row_versions() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO test_task_row_versions (task_id) VALUES (NEW.id); RETURN NULL; END $$",
        "CREATE TRIGGER test_task_row_versions AFTER UPDATE ON tasks"
        " FOR EACH ROW EXECUTE FUNCTION test_task_row_versions()",
    ],
}
_STOP_COUNTING = {
    "sqlite": ["DROP TRIGGER test_task_row_versions"],
    "postgresql": [
        "DROP TRIGGER test_task_row_versions ON tasks",
        "DROP FUNCTION test_task_row_versions()",
    ],
}


@asynccontextmanager
async def task_row_versions(db: Database) -> AsyncIterator[Callable[[uuid.UUID], Awaitable[int]]]:
    """How many versions of a task's row the block's writes made, whatever statement made them (one a row
    an UPDATE matched: a row trigger's count), the claim's included, which names no task."""
    async with db.transaction() as conn:
        await conn.run_sync(_VERSIONS.create)
        for statement in _COUNT_VERSIONS[db.dialect]:
            await conn.exec_driver_sql(statement)

    async def versions(task_id: uuid.UUID) -> int:
        async with db.read() as conn:
            counted = select(func.count()).where(_VERSIONS.c.task_id == task_id)
            return int((await conn.execute(counted)).scalar_one())

    try:
        yield versions
    finally:
        async with db.transaction() as conn:
            for statement in _STOP_COUNTING[db.dialect]:
                await conn.exec_driver_sql(statement)
            await conn.run_sync(_VERSIONS.drop)


# --- running to an end ----------------------------------------------------------------------------


async def test_power_off_completes_and_switches_everything_off(db: Database) -> None:
    rack = await make_rack(db)
    async with executing(db):
        task = await finished(db, await submit(db, rack, Operation(OperationKind.POWER_OFF)))
    assert task.status is TaskStatus.COMPLETED
    assert task.message == "powered off 5 components"
    assert task.started_at is not None and task.finished_at is not None
    assert {c.power_state for c in (await components(db, rack)).values()} == {PowerState.OFF}
    assert (await row(db, task)).owner_id is None


async def test_power_shelves_come_up_first_and_go_down_last(db: Database) -> None:
    rack = await make_rack(db, computes=2)
    backend = Recording(SimulatorBackend(FAST))
    async with executing(db, backend):
        await finished(db, await submit(db, rack, Operation(OperationKind.POWER_ON)))
        on_order, backend.steps = backend.steps, []
        await finished(db, await submit(db, rack, Operation(OperationKind.POWER_OFF)))
    assert on_order == ["shelf-0", "switch-0", "compute-0", "compute-1"]
    assert backend.steps == ["compute-0", "compute-1", "switch-0", "shelf-0"]


async def test_the_executor_records_what_a_wrapping_backend_reports(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    backend = Recording(SimulatorBackend(FAST))
    async with executing(db, backend):
        task = await finished(db, await submit(db, rack, Operation(OperationKind.POWER_OFF)))
    assert (task.status, task.message) == (TaskStatus.COMPLETED, "powered off 3 components")
    assert {c.power_state for c in (await components(db, rack)).values()} == {PowerState.OFF}


async def test_firmware_upgrade_sets_the_version(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    async with executing(db):
        task = await finished(
            db, await submit(db, rack, Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.5"))
        )
    assert task.message == "upgraded firmware of 3 components to 2.5"
    assert {c.firmware_version for c in (await components(db, rack)).values()} == {"2.5"}


async def test_injected_failure_fails_the_task_at_that_component(db: Database) -> None:
    rack = await make_rack(db)
    backend = SimulatorBackend(SimulatorConfig(step_seconds=0.01, fail_external_ids=frozenset({"gpu-1"})))
    async with executing(db, backend):
        task = await finished(db, await submit(db, rack, Operation(OperationKind.POWER_ON)))
    assert task.status is TaskStatus.FAILED
    assert task.message.startswith("power_on failed on compute-1 (4/5): simulated failure")
    states = {name: c.power_state for name, c in (await components(db, rack)).items()}
    assert states["compute-0"] is PowerState.ON and states["compute-2"] is PowerState.UNKNOWN


async def test_queued_tasks_run_in_order(db: Database) -> None:
    rack = await make_rack(db)
    off = await submit(db, rack, Operation(OperationKind.POWER_OFF))
    on = await submit(db, rack, Operation(OperationKind.POWER_ON), QUEUE)
    assert on.status is TaskStatus.WAITING
    async with executing(db):
        await finished(db, on)
    off, on = await get(db, off), await get(db, on)
    assert off.finished_at is not None and on.started_at is not None and off.finished_at <= on.started_at
    assert {c.power_state for c in (await components(db, rack)).values()} == {PowerState.ON}


def counting_polls(executor: Executor) -> list[None]:
    """One entry per poll `executor` has finished from now on (it calls `poll` anew each time)."""
    polls: list[None] = []
    poll = executor.poll

    async def counted() -> None:
        await poll()
        polls.append(None)

    executor.poll = counted  # type: ignore[method-assign]
    return polls


async def test_a_submit_wakes_the_executor_at_once(db: Database) -> None:
    """Its first poll over, the executor naps for an hour: only the submit's wake can start the task within
    `finished`'s wait."""
    rack = await make_rack(db, computes=1)
    async with executing(db, poll_interval=3600.0) as executor:
        polls = counting_polls(executor)

        async def napping() -> bool:
            return bool(polls)

        await eventually(napping)
        [task] = await executor.manager.submit(
            Operation(OperationKind.POWER_ON), [RackSelection(rack.id)], description="", queue=REJECT
        )
        task = await finished(db, task)
    assert task.status is TaskStatus.COMPLETED


# --- cancellation -----------------------------------------------------------------------------------


async def test_cancelling_a_running_task_stops_its_steps(db: Database) -> None:
    rack = await make_rack(db, computes=6)
    slow = SimulatorBackend(SimulatorConfig(step_seconds=0.2))
    manager = TaskManager(db, CLOCK)
    async with executing(db, slow, progress_interval=0.05):  # each step's message written: it waits for one
        task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
        queued = await submit(db, rack, Operation(OperationKind.POWER_ON), QUEUE)

        async def started() -> bool:
            return (await get(db, task)).message.startswith("powering off 2/")

        await eventually(started)
        cancelled = await manager.cancel(task.id)
        assert (cancelled.status, cancelled.message) == (TaskStatus.TERMINATED, CANCELLED_MESSAGE)
        await finished(db, queued)
    assert (await get(db, queued)).status is TaskStatus.COMPLETED
    assert (await get(db, task)).message == CANCELLED_MESSAGE
    assert (await row(db, task)).owner_id is None


@pytest.mark.parametrize("stopped", ["cancelled", "taken over"])
async def test_a_task_stopped_during_a_step_runs_no_next_step_though_no_message_is_written(
    db: Database, stopped: str
) -> None:
    """A batch whose progress message is not written is fenced all the same, before it starts: its journal
    round locks the task's row, and finds the task no longer RUNNING and this instance's. What the steps
    that ran changed is recorded, each in the round after it."""
    rack = await make_rack(db, computes=6)
    backend = Pausing(at=3)
    rival = uuid.uuid4()  # alive, so the task stays its (lease_ttl)
    await instances.register(db, rival, host="rival", pid=1)
    async with executing(db, backend, progress_interval=3600.0, lease_ttl=60.0) as executor:
        task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
        await eventually(backend.paused)
        if stopped == "cancelled":
            await TaskManager(db, CLOCK).cancel(task.id)
        else:  # as the claim of an instance that found this one's lease expired
            async with db.transaction() as conn:
                taken = update(tasks_table).where(tasks_table.c.id == task.id)
                await conn.execute(taken.values(owner_id=rival, attempts=tasks_table.c.attempts + 1))
        backend.go.set()
        await eventually(lambda: _not_running_here(executor, task))
    assert backend.started == ["compute-0", "compute-1", "compute-2"]
    states = {name: c.power_state for name, c in (await components(db, rack)).items()}
    assert {name for name, state in states.items() if state is PowerState.OFF} == set(backend.started)
    stored = await row(db, task)
    if stopped == "cancelled":
        assert (stored.status, stored.message, stored.owner_id) == ("terminated", CANCELLED_MESSAGE, None)
    else:
        assert (stored.status, stored.message, stored.owner_id) == (
            "running",
            "powering off 1/8: compute-0",
            rival,
        )


async def test_a_tasks_steps_rewrite_its_row_only_when_its_message_is_due(db: Database) -> None:
    """Each step wrote the task's progress message: a new version of its row at every step, 36 times a
    task on an NVL72 rack, the row 1.75 KB (docs/CAPACITY.md, "Racks of 36 components"). A batch is fenced
    by a lock of the row, and its message left to the progress tick (none within this task's run): only
    the claim (the first message) and the end write the row; what each step changed is still written."""
    rack = await make_rack(db, computes=6)
    task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
    with task_row_writes(db, task.id) as writes:
        async with executing(db, progress_interval=3600.0):
            done = await finished(db, task)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "powered off 8 components")
    assert len(writes) == 2, writes
    assert {c.power_state for c in (await components(db, rack)).values()} == {PowerState.OFF}


async def test_a_task_of_quick_steps_makes_two_versions_of_its_row(db: Database) -> None:
    """The claim's UPDATE writes the first batch's progress message: written by a statement of its own, in
    the claim's transaction, it made a third version of every task's row, with its WAL (docs/CAPACITY.md,
    "Racks of 36 components")."""
    rack = await make_rack(db, computes=6)
    task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
    async with task_row_versions(db) as versions:
        async with executing(db, progress_interval=3600.0):
            done = await finished(db, task)
        assert (done.status, done.message) == (TaskStatus.COMPLETED, "powered off 8 components")
        assert await versions(task.id) == 2


async def test_the_message_of_the_batch_under_way_is_written_by_the_progress_tick(db: Database) -> None:
    """The message lags the batch under way by at most the interval: the third step's, not written as the
    step started, is written while it runs."""
    rack = await make_rack(db, computes=6)
    backend = Pausing(at=3)
    async with executing(db, backend, progress_interval=0.5):
        task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
        await eventually(backend.paused)

        async def shown() -> bool:
            return (await get(db, task)).message == "powering off 3/8: compute-2"

        await eventually(shown)
        assert backend.started == ["compute-0", "compute-1", "compute-2"]  # it still runs
        backend.go.set()
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


# --- takeover -------------------------------------------------------------------------------------


async def test_a_task_of_a_dead_instance_is_taken_over(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
    await start_running(db, task, uuid.uuid4(), heartbeat_age=timedelta(minutes=5))
    async with executing(db) as executor:
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED
    taken = await row(db, task)
    assert taken.attempts == 2 and taken.owner_id is None
    async with db.read() as conn:
        registered = set((await conn.execute(select(instances_table.c.id))).scalars())
    assert executor.instance_id not in registered  # it unregistered as it stopped


async def test_heartbeats_keep_a_long_task_with_its_owner(db: Database) -> None:
    rack = await make_rack(db, computes=6)
    # The task (8 steps of 0.4 s) outlasts the lease (2 s) more than once; a lease this short still
    # leaves room for a loaded machine's scheduling delays.
    slow = SimulatorBackend(SimulatorConfig(step_seconds=0.4))
    async with executing(db, slow, lease_ttl=2.0) as owner:
        task = await submit(db, rack, Operation(OperationKind.POWER_OFF))

        async def running() -> bool:
            return (await row(db, task)).owner_id == owner.instance_id

        await eventually(running)
        async with executing(db, lease_ttl=2.0):  # a rival that would take over an expired lease
            done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED and (await row(db, task)).attempts == 1


async def test_a_stopped_instance_hands_its_task_over_at_once(db: Database) -> None:
    rack = await make_rack(db, computes=6)
    slow = SimulatorBackend(SimulatorConfig(step_seconds=0.2))
    async with executing(db, slow, lease_ttl=60.0):
        task = await submit(db, rack, Operation(OperationKind.POWER_OFF))

        async def running() -> bool:
            return (await get(db, task)).status is TaskStatus.RUNNING

        await eventually(running)
    assert (await get(db, task)).status is TaskStatus.RUNNING  # left for a successor, not failed
    async with executing(db, lease_ttl=60.0):  # no waiting for the 60 s lease: the owner unregistered
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED and (await row(db, task)).attempts == 2


async def test_a_live_owner_keeps_its_task(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, Operation(OperationKind.POWER_OFF))
    await start_running(db, task, uuid.uuid4(), heartbeat_age=timedelta(0))
    async with executing(db, lease_ttl=30.0) as executor:
        polls = counting_polls(executor)

        async def polled_a_few_times() -> bool:  # each poll's claim would take over an expired lease
            return len(polls) >= 3

        await eventually(polled_a_few_times)
    assert (await get(db, task)).status is TaskStatus.RUNNING


async def test_a_restarted_instance_resumes_its_own_task(db: Database) -> None:
    rack = await make_rack(db)
    me = uuid.uuid4()
    task = await submit(db, rack, Operation(OperationKind.POWER_ON))
    await start_running(db, task, me, heartbeat_age=timedelta(0))
    async with executing(db, instance_id=me, lease_ttl=30.0):
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


async def test_a_task_that_keeps_dying_fails_after_max_attempts(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, Operation(OperationKind.POWER_ON))
    await start_running(db, task, uuid.uuid4(), attempts=MAX_ATTEMPTS)
    async with executing(db):
        done = await finished(db, task)
    assert done.status is TaskStatus.FAILED and "gave up" in done.message


# --- maintenance windows --------------------------------------------------------------------------


async def test_firmware_waits_for_its_window_and_fails_after_it(db: Database) -> None:
    rack = await make_rack(db)
    now = datetime.now(UTC)
    later = Operation(
        OperationKind.UPGRADE_FIRMWARE, target_version="3", window_start=now + timedelta(hours=1)
    )
    missed = Operation(
        OperationKind.UPGRADE_FIRMWARE,
        target_version="3",
        window_start=now - timedelta(hours=2),
        window_end=now - timedelta(hours=1),
    )
    manager = TaskManager(db, CLOCK)
    [waiting] = await manager.submit(later, [RackSelection(rack.id, None)], description="", queue=REJECT)
    assert waiting.message.startswith("waits for its maintenance window")
    await manager.cancel(waiting.id)
    # Submitted while its window was open (a submit after its end is refused), claimed after it.
    while_open = TaskManager(db, FakeClock(now - timedelta(hours=2)))
    [late] = await while_open.submit(missed, [RackSelection(rack.id)], description="", queue=REJECT)
    [pending] = await manager.submit(later, [RackSelection(rack.id)], description="", queue=QUEUE)
    async with executing(db) as executor:
        polls = counting_polls(executor)
        done = await finished(db, late)
        seen = len(polls)

        async def polled_again() -> bool:  # a claim after the late task ended: `pending` stays
            return len(polls) >= seen + 2

        await eventually(polled_again)
    assert done.status is TaskStatus.FAILED and "maintenance window ended" in done.message
    assert (await get(db, pending)).status is TaskStatus.PENDING


# --- cost ----------------------------------------------------------------------------------------


async def test_many_tasks_share_a_few_transactions_and_connections(db: Database) -> None:
    racks = [
        await InventoryService(db, CLOCK).create_rack(
            f"r{i}", components=[ComponentSpec(ComponentType.COMPUTE, "c")]
        )
        for i in range(24)
    ]
    manager = TaskManager(db, CLOCK)
    made = [await submit(db, rack, Operation(OperationKind.POWER_ON)) for rack in racks]
    held, peak, commits = [0], [0], [0]

    def checked_out(*_: Any) -> None:
        held[0] += 1
        peak[0] = max(peak[0], held[0])

    def checked_in(*_: Any) -> None:
        held[0] -= 1

    def committed(*_: Any) -> None:
        commits[0] += 1

    listeners = [
        (db.engine.sync_engine.pool, "checkout", checked_out),
        (db.engine.sync_engine.pool, "checkin", checked_in),
        (db.engine.sync_engine, "commit", committed),
    ]
    for target, name, listener in listeners:
        event.listen(target, name, listener)
    watcher = Database(db.url)  # the test's own reads must not count
    try:
        async with executing(db, manager=manager, poll_interval=1.0):
            for task in made:
                assert (await finished(watcher, task)).status is TaskStatus.COMPLETED
    finally:
        await watcher.dispose()
        for target, name, listener in listeners:  # the engine is the next test's too (tests/conftest.py)
            event.remove(target, name, listener)
    # Before the journal, each task took about five transactions and a connection of its own.
    assert peak[0] <= 3
    assert commits[0] < len(made) / 2
    assert {c.power_state for r in racks for c in (await components(db, r)).values()} == {PowerState.ON}


async def test_the_sweep_runs_on_a_timer_not_every_poll(db: Database) -> None:
    manager = TaskManager(db, CLOCK)
    sweeps = []
    sweep = manager.sweep

    async def counted(**options: Any) -> list[uuid.UUID]:
        sweeps.append(options)
        return await sweep(**options)

    manager.sweep = counted  # type: ignore[method-assign]
    async with executing(db, manager=manager, poll_interval=0.01, sweep_interval=60.0) as executor:
        polls = counting_polls(executor)

        async def polled_twenty_times() -> bool:
            executor.wake()
            return len(polls) >= 20

        await eventually(polled_twenty_times)
    assert len(sweeps) == 1

    async def swept_again() -> bool:
        return len(sweeps) >= 4

    async with executing(db, manager=manager, poll_interval=0.01, sweep_interval=0.05):
        await eventually(swept_again)


# --- the simulator's configuration ------------------------------------------------------------------


def test_simulator_config_from_env() -> None:
    config = SimulatorConfig.from_env(
        {
            "RACKFLOW_SIM_STEP_SECONDS": "0.5",
            "RACKFLOW_SIM_FAIL_IDS": "a, b,,",
            "RACKFLOW_SIM_FAIL_RATE": "0.25",
            "RACKFLOW_SIM_SEED": "7",
            "RACKFLOW_SIM_STEP_JITTER": "0.3",
        }
    )
    assert config == SimulatorConfig(0.5, frozenset({"a", "b"}), 0.25, 7, step_jitter=0.3)
    assert SimulatorConfig.from_env({}) == SimulatorConfig()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RACKFLOW_SIM_STEP_SECONDS", "fast"),
        ("RACKFLOW_SIM_STEP_SECONDS", "-1"),
        ("RACKFLOW_SIM_FAIL_RATE", "2"),
        ("RACKFLOW_SIM_SEED", "x"),
        ("RACKFLOW_SIM_STEP_JITTER", "1.5"),
    ],
)
def test_simulator_config_rejects_bad_values(name: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        SimulatorConfig.from_env({name: value})


async def test_a_task_cancelled_while_its_cut_short_run_waits_to_be_taken_again_lets_its_rack_go(
    db: Database,
) -> None:
    """A run cut short by an error (here every journal round fails, as in a database blip) leaves its task
    RUNNING and this instance's, for its next claim to take up again. Cancelled meanwhile, the task is no
    longer RUNNING, so no claim takes it, and the dead-hold sweep spares a live owner: it held its rack,
    and the task waiting behind it, until the process ended. The executor now lets it go."""
    rack = await make_rack(db)
    first = await submit(db, rack, Operation(OperationKind.POWER_ON))
    executor = Executor(
        db,
        CLOCK,
        SimulatorBackend(SimulatorConfig(step_seconds=0.05)),
        instance_id=uuid.uuid4(),
        poll_interval=0.05,
        lease_ttl=1.0,
        sweep_interval=0.1,
    )
    blip = asyncio.Event()
    write_round = executor._write_round

    async def failing_in_the_blip(conn: AsyncConnection, entries: Sequence[Any]) -> Any:
        if any(entry.task_id == first.id and entry.ending is None for entry in entries):
            blip.set()  # the first fence of a batch of its run (with its progress message or not)
        if blip.is_set():
            raise RuntimeError("the database blipped")
        return await write_round(conn, entries)

    executor._journal.write_many = failing_in_the_blip  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        await asyncio.wait_for(blip.wait(), 10)
        await eventually(lambda: _not_running_here(executor, first))
        assert (await TaskManager(db, CLOCK).cancel(first.id)).status is TaskStatus.TERMINATED
        behind = await submit(db, rack, Operation(OperationKind.POWER_OFF), QUEUE)
        assert behind.status is TaskStatus.WAITING
        blip.clear()
        assert (await finished(db, behind)).status is TaskStatus.COMPLETED
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


async def _not_running_here(executor: Executor, task: Task) -> bool:
    return task.id not in executor._running


async def test_a_poll_the_database_is_unavailable_for_is_one_warning_line_and_a_bug_a_traceback(
    db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a database outage the executor logged `executor poll failed` at ERROR with an 80-line
    traceback at every poll (ten in five seconds), where the dispatcher and the notifier log one WARNING
    line each (docs/OPERATIONS.md, "Logs": any ERROR is worth a look)."""
    failures = iter([Unavailable("database unavailable: connection refused"), RuntimeError("a bug")])
    both = asyncio.Event()

    async def poll() -> None:
        failure = next(failures, None)
        if failure is None:
            both.set()
            return
        raise failure

    async with executing(db) as executor:
        monkeypatch.setattr(executor, "poll", poll)
        with caplog.at_level(logging.WARNING, logger="rackflow.tasks.executor"):
            await asyncio.wait_for(both.wait(), 10)
    failed = [
        (r.levelno, r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if "poll failed" in r.getMessage()
    ]
    assert failed == [
        (logging.WARNING, "executor poll failed (database unavailable: connection refused); retrying", False),
        (logging.ERROR, "executor poll failed; retrying", True),
    ]
