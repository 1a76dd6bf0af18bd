"""TaskManager on SQLite and PostgreSQL: conflicts, queueing, promotion, expiry, cancel, filters."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.clock import FakeClock
from rackflow.domain.inventory import (
    ComponentsFilter,
    ComponentSpec,
    ComponentType,
    Rack,
    RackSelection,
    RackTarget,
    TargetSpec,
    TypesFilter,
)
from rackflow.domain.tasks import (
    ConflictStrategy,
    Ending,
    Operation,
    OperationKind,
    QueueOptions,
    Task,
    TaskStatus,
)
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound
from rackflow.inventory.service import InventoryService
from rackflow.store import task_runs
from rackflow.store import tasks as store
from rackflow.store.db import Database
from rackflow.tasks.manager import CANCELLED_MESSAGE, EXPIRED_MESSAGE, TaskManager
from tests.conftest import table_counts
from tests.store.lock_waits import waiting_for

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
REJECT = QueueOptions(ConflictStrategy.REJECT)
QUEUE = QueueOptions(ConflictStrategy.QUEUE)
POWER_OFF = Operation(OperationKind.POWER_OFF)
POWER_ON = Operation(OperationKind.POWER_ON)
FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.0")


def rack_specs() -> list[ComponentSpec]:
    return [
        ComponentSpec(ComponentType.POWERSHELF, "shelf-0"),
        *(ComponentSpec(ComponentType.COMPUTE, f"compute-{i}") for i in range(4)),
        ComponentSpec(ComponentType.NVSWITCH, "switch-0"),
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def manager(db: Database, clock: FakeClock) -> TaskManager:
    return TaskManager(db, clock)


async def make_rack(db: Database, clock: FakeClock, name: str = "r1") -> Rack:
    return await InventoryService(db, clock).create_rack(name, components=rack_specs())


def computes(rack: Rack) -> list[uuid.UUID]:
    return [c.id for c in rack.components if c.type is ComponentType.COMPUTE]


def only(*ids: uuid.UUID) -> ComponentsFilter:
    return ComponentsFilter(frozenset(ids))


async def submit(
    manager: TaskManager,
    rack: Rack,
    operation: Operation = POWER_OFF,
    queue: QueueOptions = REJECT,
    component_filter: TypesFilter | ComponentsFilter | None = None,
) -> Task:
    [task] = await manager.submit(
        operation, [RackSelection(rack.id, component_filter)], description="test", queue=queue
    )
    return task


async def statuses(manager: TaskManager, *tasks: Task) -> list[TaskStatus]:
    return [t.status for t in await manager.get_tasks([t.id for t in tasks])]


async def start_running(db: Database, task: Task, owner: uuid.UUID) -> None:
    async with db.transaction() as conn:
        await task_runs.mark_running(conn, task.id, owner_id=owner, now=datetime.now(UTC))


# --- submitting --------------------------------------------------------------------------------


async def test_submit_makes_one_pending_task_per_rack(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    r1, r2 = await make_rack(db, clock, "r1"), await make_rack(db, clock, "r2")
    schedule_id = uuid.uuid4()
    made = await manager.submit(
        POWER_OFF,
        [RackSelection(r1.id), RackSelection(r2.id)],
        description="night",
        queue=REJECT,
        schedule_id=schedule_id,
    )
    assert [t.rack_id for t in made] == [r1.id, r2.id]
    assert all(t.status is TaskStatus.PENDING and t.queue_expires_at is None for t in made)
    assert set(made[0].component_ids) == {c.id for c in r1.components}
    stored = await manager.get_tasks([t.id for t in made])
    assert stored == made
    assert stored[0].created_at == START and stored[0].schedule_id == schedule_id
    assert stored[0].description == "night"


async def test_reject_refuses_a_conflict_and_writes_nothing(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    first = await submit(manager, rack)
    before = await table_counts(db)
    with pytest.raises(FailedPrecondition) as err:
        await submit(manager, rack, POWER_ON)
    assert str(first.id) in str(err.value) and "r1" in str(err.value)
    assert await table_counts(db) == before


async def test_queue_parks_a_conflict_as_waiting(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    await submit(manager, rack)
    default = await submit(manager, rack, POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(0)))
    short = await submit(manager, rack, POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(seconds=90)))
    assert default.status is TaskStatus.WAITING and default.queue_expires_at == START + timedelta(hours=1)
    assert short.queue_expires_at == START + timedelta(seconds=90)


async def test_disjoint_components_do_not_conflict(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    gpus = computes(rack)
    a = await submit(manager, rack, POWER_OFF, component_filter=only(gpus[0], gpus[1]))
    b = await submit(manager, rack, FIRMWARE, component_filter=only(gpus[2]))
    assert (a.status, b.status) == (TaskStatus.PENDING, TaskStatus.PENDING)
    with pytest.raises(FailedPrecondition):
        await submit(manager, rack, POWER_ON, component_filter=only(gpus[1]))


async def test_waiting_queue_holds_at_most_five(db: Database, clock: FakeClock, manager: TaskManager) -> None:
    rack = await make_rack(db, clock)
    await submit(manager, rack)
    for _ in range(5):
        assert (await submit(manager, rack, POWER_ON, QUEUE)).status is TaskStatus.WAITING
    before = await table_counts(db)
    with pytest.raises(FailedPrecondition, match="waiting queue full"):
        await submit(manager, rack, POWER_ON, QUEUE)
    assert await table_counts(db) == before


async def test_multi_rack_submit_is_all_or_nothing(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    free, busy = await make_rack(db, clock, "free"), await make_rack(db, clock, "busy")
    await submit(manager, busy)
    before = await table_counts(db)
    with pytest.raises(FailedPrecondition, match="busy"):
        await manager.submit(
            POWER_ON, [RackSelection(free.id), RackSelection(busy.id)], description="", queue=REJECT
        )
    assert await table_counts(db) == before
    assert await manager.list_tasks(rack_id=free.id) == ([], 0)


async def test_filters_pick_components(db: Database, clock: FakeClock, manager: TaskManager) -> None:
    rack = await make_rack(db, clock)
    gpus = computes(rack)
    compute_only = TypesFilter(frozenset({ComponentType.COMPUTE}))
    by_type = await submit(manager, rack, FIRMWARE, component_filter=compute_only)
    assert set(by_type.component_ids) == set(gpus)
    await manager.cancel(by_type.id)
    by_id = await submit(manager, rack, FIRMWARE, component_filter=only(gpus[3]))
    assert by_id.component_ids == (gpus[3],)


@pytest.mark.parametrize(
    "component_filter",
    [
        TypesFilter(frozenset({ComponentType.CDU})),
        ComponentsFilter(frozenset({uuid.uuid4()})),
    ],
)
async def test_a_filter_that_selects_nothing_is_invalid(
    db: Database, clock: FakeClock, manager: TaskManager, component_filter: TypesFilter | ComponentsFilter
) -> None:
    rack = await make_rack(db, clock)
    with pytest.raises(InvalidArgument, match="r1"):
        await submit(manager, rack, component_filter=component_filter)


@pytest.mark.parametrize(
    ("operation", "queue", "description", "field"),
    [
        (Operation(OperationKind.UPGRADE_FIRMWARE), REJECT, "", "target_version"),
        (
            Operation(
                OperationKind.UPGRADE_FIRMWARE, target_version="1", window_start=START, window_end=START
            ),
            REJECT,
            "",
            "end_time",
        ),
        (POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(hours=25)), "", "queue_timeout_seconds"),
        (POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(seconds=-1)), "", "queue_timeout_seconds"),
        (POWER_ON, REJECT, "x" * 1025, "description"),
    ],
)
async def test_bad_requests_are_invalid(
    db: Database,
    clock: FakeClock,
    manager: TaskManager,
    operation: Operation,
    queue: QueueOptions,
    description: str,
    field: str,
) -> None:
    rack = await make_rack(db, clock)
    before = await table_counts(db)
    with pytest.raises(InvalidArgument, match=field):
        await manager.submit(operation, [RackSelection(rack.id)], description=description, queue=queue)
    assert await table_counts(db) == before


async def test_unknown_and_duplicate_racks(db: Database, clock: FakeClock, manager: TaskManager) -> None:
    rack = await make_rack(db, clock)
    with pytest.raises(NotFound):
        await manager.submit(POWER_ON, [RackSelection(uuid.uuid4())], description="", queue=REJECT)
    with pytest.raises(InvalidArgument, match="twice"):
        await manager.submit(POWER_ON, [RackSelection(rack.id)] * 2, description="", queue=REJECT)


async def test_submit_target_resolves_the_spec(db: Database, clock: FakeClock, manager: TaskManager) -> None:
    rack = await make_rack(db, clock)
    spec = TargetSpec(racks=(RackTarget(name="r1", component_types=(ComponentType.NVSWITCH,)),))
    [task] = await manager.submit(POWER_ON, spec, description="", queue=REJECT)
    assert task.component_ids == tuple(c.id for c in rack.components if c.type is ComponentType.NVSWITCH)
    with pytest.raises(NotFound):
        await manager.submit(
            POWER_ON, TargetSpec(racks=(RackTarget(name="nope"),)), description="", queue=REJECT
        )


async def test_submit_wakes_listeners_only_for_pending_tasks(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    calls: list[int] = []
    manager.on_submit.append(lambda: calls.append(1))
    await submit(manager, rack)
    await submit(manager, rack, POWER_ON, QUEUE)
    assert calls == [1]


# --- promotion and expiry ----------------------------------------------------------------------


async def test_promotion_is_oldest_first_and_stops_at_a_conflict(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    gpus = computes(rack)
    blocker = await submit(manager, rack)
    waiting = []
    for gpu in (gpus[0], gpus[1], gpus[0], gpus[2]):
        clock.advance(timedelta(seconds=1))
        waiting.append(await submit(manager, rack, FIRMWARE, QUEUE, only(gpu)))
    await manager.cancel(blocker.id)
    assert await statuses(manager, *waiting) == [
        TaskStatus.PENDING,
        TaskStatus.PENDING,
        TaskStatus.WAITING,
        TaskStatus.WAITING,
    ]
    await manager.cancel(waiting[0].id)
    assert await statuses(manager, *waiting[2:]) == [TaskStatus.PENDING, TaskStatus.PENDING]


async def test_finish_promotes_and_sweep_expires(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    owner = uuid.uuid4()
    running = await submit(manager, rack)
    await start_running(db, running, owner)
    short = await submit(manager, rack, POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(seconds=60)))
    long = await submit(manager, rack, POWER_ON, QueueOptions(ConflictStrategy.QUEUE, timedelta(hours=2)))
    clock.advance(timedelta(seconds=61))
    # The owner is not registered, but a RUNNING task is never swept: only takeover ends it.
    assert await manager.sweep(lease_ttl=timedelta(seconds=15)) == []
    [expired] = await manager.get_tasks([short.id])
    assert (expired.status, expired.message) == (TaskStatus.TERMINATED, EXPIRED_MESSAGE)
    assert expired.finished_at == START + timedelta(seconds=61)
    assert await manager.finish(running.id, owner_id=owner, status=TaskStatus.COMPLETED, message="done")
    assert await statuses(manager, running, long) == [TaskStatus.COMPLETED, TaskStatus.PENDING]


async def test_sweep_promotes_a_rack_nothing_blocks(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    blocker = await submit(manager, rack)
    queued = await submit(manager, rack, POWER_ON, QUEUE)
    async with db.transaction() as conn:  # as if a crash had skipped the promotion
        await store.set_status(conn, [blocker.id], TaskStatus.FAILED, now=clock.now())
    assert await manager.sweep(lease_ttl=timedelta(seconds=15)) == [queued.id]


# --- cancelling --------------------------------------------------------------------------------


async def test_cancel_waiting_and_pending(db: Database, clock: FakeClock, manager: TaskManager) -> None:
    rack = await make_rack(db, clock)
    pending = await submit(manager, rack)
    waiting = await submit(manager, rack, POWER_ON, QUEUE)
    cancelled = await manager.cancel(waiting.id)
    assert (cancelled.status, cancelled.message) == (TaskStatus.TERMINATED, CANCELLED_MESSAGE)
    assert cancelled.finished_at == START
    assert (await manager.cancel(pending.id)).status is TaskStatus.TERMINATED
    again = await manager.cancel(pending.id)
    assert again.status is TaskStatus.TERMINATED and again.message == CANCELLED_MESSAGE


@pytest.mark.parametrize("final", [TaskStatus.COMPLETED, TaskStatus.FAILED])
async def test_cancel_refuses_finished_tasks(
    db: Database, clock: FakeClock, manager: TaskManager, final: TaskStatus
) -> None:
    rack = await make_rack(db, clock)
    task = await submit(manager, rack)
    async with db.transaction() as conn:
        await store.set_status(conn, [task.id], final, now=clock.now())
    with pytest.raises(FailedPrecondition, match=final.value):
        await manager.cancel(task.id)
    with pytest.raises(NotFound):
        await manager.cancel(uuid.uuid4())


async def test_cancelled_running_task_blocks_until_its_executor_lets_go(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    owner = uuid.uuid4()
    running = await submit(manager, rack)
    await start_running(db, running, owner)
    queued = await submit(manager, rack, POWER_ON, QUEUE)
    assert (await manager.cancel(running.id)).status is TaskStatus.TERMINATED
    assert await statuses(manager, queued) == [TaskStatus.WAITING]
    with pytest.raises(FailedPrecondition):  # the hardware is still busy
        await submit(manager, rack, POWER_ON)
    # The executor notices, its finish is refused, and its hold is dropped: the queue moves on.
    assert not await manager.finish(running.id, owner_id=owner, status=TaskStatus.COMPLETED, message="x")
    assert await statuses(manager, running, queued) == [TaskStatus.TERMINATED, TaskStatus.PENDING]
    [after] = await manager.get_tasks([running.id])
    assert after.message == CANCELLED_MESSAGE


async def test_sweep_drops_the_hold_of_a_dead_owner(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    rack = await make_rack(db, clock)
    running = await submit(manager, rack)
    await start_running(db, running, uuid.uuid4())  # an owner with no heartbeat: dead
    queued = await submit(manager, rack, POWER_ON, QUEUE)
    await manager.cancel(running.id)
    assert await manager.sweep(lease_ttl=timedelta(seconds=15)) == [queued.id]


# --- reading -----------------------------------------------------------------------------------


async def test_list_tasks_newest_first_with_filters(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    r1, r2 = await make_rack(db, clock, "r1"), await make_rack(db, clock, "r2")
    schedule_id = uuid.uuid4()
    first = await submit(manager, r1)
    clock.advance(timedelta(seconds=1))
    [second] = await manager.submit(
        POWER_OFF, [RackSelection(r2.id)], description="", queue=REJECT, schedule_id=schedule_id
    )
    clock.advance(timedelta(seconds=1))
    third = await submit(manager, r1, POWER_ON, QUEUE)
    await manager.cancel(first.id)  # promotes `third`
    assert [t.id for t in (await manager.list_tasks())[0]] == [third.id, second.id, first.id]
    assert (await manager.list_tasks())[1] == 3
    page, total = await manager.list_tasks(offset=1, limit=1)
    assert [t.id for t in page] == [second.id] and total == 3
    assert [t.id for t in (await manager.list_tasks(rack_id=r1.id))[0]] == [third.id, first.id]
    assert [t.id for t in (await manager.list_tasks(active_only=True))[0]] == [third.id, second.id]
    assert (await manager.list_tasks(schedule_id=schedule_id)) == ([second], 1)


async def test_get_tasks_keeps_request_order_and_skips_unknown(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    r1, r2 = await make_rack(db, clock, "r1"), await make_rack(db, clock, "r2")
    a, b = await submit(manager, r1), await submit(manager, r2)
    found = await manager.get_tasks([b.id, uuid.uuid4(), a.id, b.id])
    assert [t.id for t in found] == [b.id, a.id]


async def test_let_go_in_records_many_endings_in_one_transaction(
    db: Database, clock: FakeClock, manager: TaskManager
) -> None:
    me = uuid.uuid4()
    racks = [await make_rack(db, clock, f"r{i}") for i in range(4)]
    done, cancelled, taken_over, unsure = [await submit(manager, rack) for rack in racks]
    for task in (done, cancelled, taken_over, unsure):
        await start_running(db, task, me)
    await start_running(db, taken_over, uuid.uuid4())  # another instance has it now
    queued = [await submit(manager, rack, POWER_ON, QUEUE) for rack in racks[:3]]
    await manager.cancel(cancelled.id)
    endings = [Ending(t.id, t.rack_id, (TaskStatus.COMPLETED, "done")) for t in (done, cancelled, taken_over)]
    async with db.transaction() as conn:
        let_go = await manager.let_go_in(conn, me, [*endings, Ending(unsure.id, unsure.rack_id, None)])
    # `unsure` is reported stopped (None) but is still RUNNING here: it is neither ended nor let go.
    assert let_go.finished == {done.id} and sorted(let_go.promoted) == sorted(q.id for q in queued[:2])
    assert await statuses(manager, done, cancelled, taken_over, unsure, *queued) == [
        TaskStatus.COMPLETED,
        TaskStatus.TERMINATED,
        TaskStatus.RUNNING,
        TaskStatus.RUNNING,
        TaskStatus.PENDING,
        TaskStatus.PENDING,
        TaskStatus.WAITING,
    ]


@pytest.mark.postgres
async def test_a_task_queued_while_an_ending_waits_for_its_rack_is_promoted_by_that_ending(
    pg_db: str,
) -> None:
    """A task queued behind a running one by a submit that holds the rack while the running task's ending
    waits for it is promoted by that ending, not by the sweep seconds later: once the ending holds the
    rack, the submit has committed, and its look at the rack's waiting tasks must see what it queued."""
    db, clock = Database(pg_db), FakeClock(START)
    manager = TaskManager(db, clock)
    try:
        rack = await make_rack(db, clock)
        running, owner = await submit(manager, rack, POWER_OFF), uuid.uuid4()
        await start_running(db, running, owner)
        async with db.transaction() as submitting:
            [queued] = await manager.submit_in(
                submitting, POWER_ON, [RackSelection(rack.id, None)], description="test", queue=QUEUE
            )
            assert queued.status is TaskStatus.WAITING
            ending = asyncio.create_task(
                manager.finish(running.id, owner_id=owner, status=TaskStatus.COMPLETED, message="done")
            )
            await waiting_for(db, submitting, ending)  # the ending waits for the rack the submit holds
        assert await ending
        assert await statuses(manager, running, queued) == [TaskStatus.COMPLETED, TaskStatus.PENDING]
    finally:
        await db.dispose()
