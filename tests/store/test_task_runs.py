"""The executor's queries on SQLite and PostgreSQL: batch claim, fenced progress and endings, changes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, update

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, PowerState, Rack, RackSelection
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
from rackflow.store import instances, task_runs
from rackflow.store import tasks as store
from rackflow.store.db import Database
from rackflow.store.tables import tasks as tasks_table
from rackflow.tasks.manager import TaskManager
from tests.store.lock_waits import waiting_for

CLOCK = SystemClock()
LEASE = timedelta(seconds=15)
ME = uuid.uuid4()
REJECT = QueueOptions(ConflictStrategy.REJECT)
POWER_ON = Operation(OperationKind.POWER_ON)


@pytest.fixture(autouse=True)
async def registered(db: Database) -> None:
    """This instance is alive, as it is while its executor runs."""
    await instances.register(db, ME, host="here", pid=1)


async def make_racks(db: Database, count: int) -> list[Rack]:
    inventory = InventoryService(db, CLOCK)
    specs = [ComponentSpec(ComponentType.COMPUTE, f"c{i}") for i in range(2)]
    return [await inventory.create_rack(f"r{i}", components=specs) for i in range(count)]


async def submit(db: Database, rack: Rack, operation: Operation = POWER_ON) -> Task:
    [task] = await TaskManager(db, CLOCK).submit(
        operation, [RackSelection(rack.id)], description="", queue=REJECT
    )
    return task


async def claim(
    db: Database, limit: int = 10, running_here: tuple[uuid.UUID, ...] = ()
) -> list[tuple[Task, int]]:
    async with db.transaction() as conn:
        return await task_runs.claim(
            db,
            conn,
            owner_id=ME,
            lease_ttl=LEASE,
            running_here=running_here,
            now=datetime.now(UTC),
            limit=limit,
        )


async def run_as(db: Database, task: Task, owner: uuid.UUID) -> None:
    async with db.transaction() as conn:
        await task_runs.mark_running(conn, task.id, owner_id=owner, now=datetime.now(UTC))


async def current(db: Database, task: Task) -> Task:
    async with db.read() as conn:
        found = await store.get_task(conn, task.id)
    assert found is not None
    return found


async def test_claim_takes_several_oldest_first_in_one_go(db: Database) -> None:
    submitted = [await submit(db, rack) for rack in await make_racks(db, 3)]
    first = await claim(db, limit=2)
    assert [(t.id, attempt) for t, attempt in first] == [(submitted[0].id, 1), (submitted[1].id, 1)]
    assert all(t.status is TaskStatus.RUNNING and t.started_at is not None for t, _ in first)
    mine = tuple(t.id for t, _ in first)
    assert [t.id for t, _ in await claim(db, running_here=mine)] == [submitted[2].id]
    assert await claim(db, running_here=(*mine, submitted[2].id)) == []


async def test_claim_passes_over_what_is_not_due_or_still_owned(db: Database) -> None:
    racks = await make_racks(db, 5)
    later = Operation(OperationKind.POWER_ON, window_start=datetime.now(UTC) + timedelta(hours=1))
    not_yet = await submit(db, racks[0], later)
    live_owner = uuid.uuid4()
    await instances.register(db, live_owner, host="h", pid=1)
    owned = await submit(db, racks[1])
    await run_as(db, owned, live_owner)
    orphan = await submit(db, racks[2])  # its owner never registered: dead
    await run_as(db, orphan, uuid.uuid4())
    forgotten, running = await submit(db, racks[3]), await submit(db, racks[4])
    await run_as(db, forgotten, ME)
    await run_as(db, running, ME)
    started = (await current(db, orphan)).started_at

    taken = await claim(db, running_here=(running.id,))
    assert [(t.id, attempt) for t, attempt in taken] == [(orphan.id, 2), (forgotten.id, 2)]
    assert taken[0][0].started_at == started  # the first start is kept
    assert (await current(db, not_yet)).status is TaskStatus.PENDING


async def test_progress_and_endings_apply_only_while_the_task_is_held(db: Database) -> None:
    held, cancelled, taken_over = [await submit(db, rack) for rack in await make_racks(db, 3)]
    for task in (held, cancelled, taken_over):
        await run_as(db, task, ME)
    async with db.transaction() as conn:
        await store.set_status(conn, [cancelled.id], TaskStatus.TERMINATED, now=datetime.now(UTC))
        rival = update(tasks_table).where(tasks_table.c.id == taken_over.id).values(owner_id=uuid.uuid4())
        await conn.execute(rival)
    ids = [held.id, cancelled.id, taken_over.id]
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        fenced = await task_runs.fence(conn, ids, owner_id=ME)
        progress = await task_runs.record_progress(conn, dict.fromkeys(ids, "step 2"), owner_id=ME, now=now)
        outcomes = dict.fromkeys(ids, (TaskStatus.COMPLETED, "done"))
        finished = await task_runs.finish(conn, outcomes, owner_id=ME, now=now)
        released = await task_runs.release(conn, ids, owner_id=ME)
    assert fenced == progress == finished == {held.id} and released == {cancelled.id}
    done = await current(db, held)
    assert (done.status, done.message, done.finished_at) == (TaskStatus.COMPLETED, "done", now)
    assert (await current(db, taken_over)).message == ""


async def test_a_cancel_waits_for_the_transaction_that_fenced_its_task(db: Database) -> None:
    """The fence that writes nothing holds the task's row as a write would, until its transaction commits:
    a cancel meanwhile waits, and the executor's next fence finds the task gone."""
    [rack] = await make_racks(db, 1)
    task = await submit(db, rack)
    await run_as(db, task, ME)
    async with db.transaction() as conn:
        assert await task_runs.fence(conn, [task.id], owner_id=ME) == {task.id}
        cancel = asyncio.create_task(TaskManager(db, CLOCK).cancel(task.id))
        await waiting_for(db, conn, cancel)
    assert (await cancel).status is TaskStatus.TERMINATED
    async with db.transaction() as conn:
        assert await task_runs.fence(conn, [task.id], owner_id=ME) == set()


async def test_a_fence_waits_for_a_cancel_under_way_and_leaves_its_task_out(db: Database) -> None:
    """A cancel that holds the task's row first makes the fence wait; once it committed the fence reads the
    row again and leaves the task out, so the next batch does not start."""
    [rack] = await make_racks(db, 1)
    task = await submit(db, rack)
    await run_as(db, task, ME)

    async def fence() -> set[uuid.UUID]:
        async with db.transaction() as conn:
            return await task_runs.fence(conn, [task.id], owner_id=ME)

    async with db.transaction() as conn:
        await store.set_status(conn, [task.id], TaskStatus.TERMINATED, now=datetime.now(UTC))
        fencing = asyncio.create_task(fence())
        await waiting_for(db, conn, fencing)
    assert await fencing == set()


async def test_record_changes_writes_each_state_once(db: Database) -> None:
    [rack] = await make_racks(db, 1)
    first, second = rack.components
    changes = [
        ComponentChange(first.id, PowerState.OFF),
        ComponentChange(second.id, PowerState.OFF),
        ComponentChange(second.id, firmware_version="2.0"),
        ComponentChange(uuid.uuid4(), PowerState.ON),  # removed meanwhile: nothing to update
    ]
    async with db.transaction() as conn:
        await task_runs.record_changes(conn, changes)
    after = {c.id: c for c in (await InventoryService(db, CLOCK).get_rack(rack.id)).components}
    assert after[first.id].power_state is PowerState.OFF and after[first.id].firmware_version == ""
    assert (after[second.id].power_state, after[second.id].firmware_version) == (PowerState.OFF, "2.0")


async def test_a_tasks_component_ids_read_back_as_written_by_every_read(db: Database) -> None:
    """`tasks.component_ids` is read as UUIDs the database makes on PostgreSQL (`types.UUIDArray`): each
    read of a task (by id, a list's page, the claim's RETURNING) gives them in the order written, not
    sorted, a component since deleted included, and a task naming none gives none."""
    racks = await make_racks(db, 2)
    named, empty = await submit(db, racks[0]), await submit(db, racks[1])
    gone = uuid.uuid4()  # a component deleted since: nothing checks the ids against `components`
    written = tuple(sorted([*named.component_ids, gone], reverse=True))
    async with db.transaction() as conn:
        stored = [str(i) for i in written]
        await conn.execute(
            update(tasks_table).where(tasks_table.c.id == named.id).values(component_ids=stored)
        )
        await conn.execute(update(tasks_table).where(tasks_table.c.id == empty.id).values(component_ids=[]))
    expected = {named.id: written, empty.id: ()}
    async with db.read(in_transaction=True) as conn:
        by_id = await store.get_tasks(conn, [named.id, empty.id])
        page, _ = await store.list_tasks(
            conn, rack_id=None, schedule_id=None, active_only=False, offset=0, limit=10
        )
    claimed = [task for task, _ in await claim(db)]
    for found in (by_id, page, claimed):
        assert {t.id: t.component_ids for t in found} == expected
        assert all(type(i) is uuid.UUID for t in found for i in t.component_ids)


async def test_record_changes_leaves_a_component_already_in_that_state_unwritten(db: Database) -> None:
    """A power reset leaves its racks on, as they were: rewriting 36 unchanged component rows a task cost
    a row version each (docs/CAPACITY.md, "Racks of 36 components")."""
    [rack] = await make_racks(db, 1)
    first, second = rack.components
    async with db.transaction() as conn:
        await task_runs.record_changes(conn, [ComponentChange(first.id, PowerState.ON)])
    updated: list[int] = []

    def count(_conn: object, cursor: Any, statement: str, *_: object) -> None:
        if statement.startswith("UPDATE components"):
            updated.append(cursor.rowcount)

    event.listen(db.engine.sync_engine, "after_cursor_execute", count)
    try:
        async with db.transaction() as conn:
            await task_runs.record_changes(
                conn, [ComponentChange(first.id, PowerState.ON), ComponentChange(second.id, PowerState.ON)]
            )
            await task_runs.record_changes(conn, [ComponentChange(first.id, firmware_version="")])
    finally:
        event.remove(db.engine.sync_engine, "after_cursor_execute", count)
    assert updated == [1, 0]  # the second component's; the first's unchanged power and firmware not rewritten
    after = {c.id: c.power_state for c in (await InventoryService(db, CLOCK).get_rack(rack.id)).components}
    assert after == {first.id: PowerState.ON, second.id: PowerState.ON}
