"""Which tasks an executor's claim may take, on both databases: above all, never one it is running."""

from __future__ import annotations

import uuid
from datetime import timedelta

from rackflow.domain.tasks import Operation, OperationKind, TaskStatus
from rackflow.inventory.service import InventoryService
from rackflow.store import task_runs
from rackflow.store import tasks as tasks_store
from rackflow.store.db import Database
from tests.store.test_executor import CLOCK, make_rack, submit

LEASE = timedelta(seconds=15)


async def _claim(db: Database, owner: uuid.UUID, running_here: list[uuid.UUID]) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        claimed = await task_runs.claim(
            db, conn, owner_id=owner, lease_ttl=LEASE, running_here=running_here, now=CLOCK.now(), limit=10
        )
    return [task.id for task, _ in claimed]


async def test_an_instance_never_reclaims_a_task_it_is_running_even_with_a_lapsed_lease(db: Database) -> None:
    task = await submit(db, await make_rack(db), Operation(OperationKind.POWER_OFF))
    me, rival = uuid.uuid4(), uuid.uuid4()  # neither has an instance row: both leases look expired
    assert await _claim(db, me, running_here=[]) == [task.id]  # PENDING: claimed, now RUNNING under `me`
    assert await _claim(db, me, running_here=[task.id]) == []  # mine and running here: never again
    assert await _claim(db, me, running_here=[]) == [task.id]  # mine but not running (run was cut short)
    assert await _claim(db, rival, running_here=[]) == [task.id]  # `me` looks dead: takeover
    async with db.read() as conn:
        found = await tasks_store.get_task(conn, task.id)
    assert found is not None and found.status is TaskStatus.RUNNING


async def test_a_task_made_after_the_claim_read_its_clock_starts_no_earlier_than_it_was_made(
    db: Database,
) -> None:
    """The claim reads its clock before its statement runs; on PostgreSQL that statement takes a task
    another instance submitted in between, made after that reading. Its start is when it was made, not
    the claim's earlier reading: no task shows a start before its making (an earlier task keeps the
    claim's time)."""
    earlier = await submit(db, await make_rack(db), Operation(OperationKind.POWER_OFF))
    claim_read_its_clock = CLOCK.now()
    other_rack = await InventoryService(db, CLOCK).create_rack("r2", components=[])
    later = await submit(db, other_rack, Operation(OperationKind.POWER_OFF))
    assert later.created_at > claim_read_its_clock > earlier.created_at

    async with db.transaction() as conn:
        claimed = await task_runs.claim(
            db,
            conn,
            owner_id=uuid.uuid4(),
            lease_ttl=LEASE,
            running_here=[],
            now=claim_read_its_clock,
            limit=10,
        )

    started = {task.id: (task.started_at, task.attempt_started_at) for task, _ in claimed}
    assert started == {
        earlier.id: (claim_read_its_clock, claim_read_its_clock),
        later.id: (later.created_at, later.created_at),
    }
