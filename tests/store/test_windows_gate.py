"""The freeze gate at task start, with the real executor on both databases: a manual task waits for the
freeze to end, the override starts it anyway, a running task is not interrupted, and changing the freeze
lets its tasks go; a hold a change could not let go of is let go by the executors' look again."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import update

from rackflow.clock import SystemClock
from rackflow.domain.audit import OK, RELEASE_FREEZE_HOLD, SYSTEM_PRINCIPAL, EventFilter
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackSelection
from rackflow.domain.tasks import Hold, Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import hold_values
from rackflow.tasks.gates import consult
from rackflow.timespec import format_rfc3339
from rackflow.windows.gate import FreezeGate
from rackflow.windows.service import WindowInput
from tests.store.test_executor import counting_polls, eventually, executing, finished, get, make_rack

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
    async with executing(db) as executor:
        waiting = await held(db, task)
        assert waiting.status is TaskStatus.PENDING
        assert waiting.not_before is not None and waiting.not_before > CLOCK.now()
        # The end as every message of rackflow writes a time (RFC 3339 in UTC, with Z), as held_reason too.
        ends = format_rfc3339(waiting.not_before)
        assert waiting.message == f"waits for freeze 'launch-week' to end at {ends}"
        assert waiting.message.endswith("Z") and "+00:00" not in waiting.message
        assert waiting.started_at is None
        polls = counting_polls(executor)

        async def polled_a_few_times() -> bool:  # each poll claims what may start
            return len(polls) >= 3

        await eventually(polled_a_few_times)
        assert (await get(db, task)).status is TaskStatus.PENDING  # still held, never started
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
        gates = [FreezeGate(db)]
        assert (await consult(gates, conn, taken_over, owner_id=owner, now=CLOCK.now())).claimed == taken_over
        assert (await consult(gates, conn, claimed, owner_id=owner, now=CLOCK.now())).claimed == []
    assert (await get(db, task)).status is TaskStatus.PENDING


async def hold_as_a_stale_claim(db: Database, task: Task, until: datetime) -> None:
    """Hold the task by the freeze until `until`, as a claim that read the freezes before a change may
    have: what is left when the change skipped its row (the claim held it) and did not live to let go of
    it once it committed."""
    hold = Hold(until, f"waits for freeze 'launch-week' to end at {format_rfc3339(until)}")
    async with db.transaction() as conn:
        held_row = update(tasks).where(tasks.c.id == task.id)
        await conn.execute(held_row.values(hold_values(FreezeGate.name, hold, CLOCK.now())))


async def rack_named(services: Services, name: str) -> uuid.UUID:
    return (
        await services.inventory.create_rack(name, components=[ComponentSpec(ComponentType.COMPUTE, "c")])
    ).id


async def test_a_look_again_lets_go_of_the_holds_the_freezes_would_end_sooner(db: Database) -> None:
    """ "launch-week" ends in an hour. A task held five hours by it (its claim read it longer) is let go;
    one held to its end stays held, and so does one held less (its claim read it shorter: at the end of
    that hold it is claimed, and held again to the end)."""
    services = Services.build(db, CLOCK)
    window = await services.windows.get(await freeze(services, hours=1))
    assert isinstance(window.when, OneOff)
    outlasting, to_its_end, shorter = [await submit(services, await rack_named(services, n)) for n in "abc"]
    sooner = CLOCK.now() + timedelta(minutes=30)
    await hold_as_a_stale_claim(db, outlasting, CLOCK.now() + timedelta(hours=5))
    await hold_as_a_stale_claim(db, to_its_end, window.when.end)
    await hold_as_a_stale_claim(db, shorter, sooner)

    assert await FreezeGate(db).look_again(CLOCK.now()) == 1

    let_go = await get(db, outlasting)
    assert (let_go.status, let_go.held_by, let_go.not_before) == (TaskStatus.PENDING, "freeze", None)
    assert (await get(db, to_its_end)).not_before == window.when.end
    assert (await get(db, shorter)).not_before == sooner


async def test_a_look_again_after_a_change_lets_go_of_what_the_change_left_held(db: Database) -> None:
    """A gate that looked before "launch-week" was shortened lets go, at its next look after, of a hold
    the change left (its let-go after commit did not run)."""
    services = Services.build(db, CLOCK)
    window_id = await freeze(services, hours=5)
    task = await submit(services, await rack_named(services, "a"))
    gate = FreezeGate(db)
    assert await gate.look_again(CLOCK.now()) == 0  # its process's first look: nothing held
    now = CLOCK.now()
    await services.windows.update(
        window_id, ["window.when"], WindowInput(when=OneOff(now - timedelta(hours=1), now))
    )
    await hold_as_a_stale_claim(db, task, now + timedelta(hours=5))

    assert await gate.look_again(CLOCK.now()) == 1
    assert (await get(db, task)).not_before is None


async def test_the_executor_looks_again_and_starts_a_task_a_deleted_freeze_left_held(db: Database) -> None:
    """A task held by a freeze that is gone (its deletion skipped the row and never let go of it): the
    executor's look again, at its dead-hold cadence, lets it go, and the task runs."""
    services = Services.build(db, CLOCK)
    await services.windows.delete(await freeze(services, hours=5))
    task = await submit(services, await rack_named(services, "a"))
    await hold_as_a_stale_claim(db, task, CLOCK.now() + timedelta(hours=5))
    async with executing(db):
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED


async def test_a_hold_a_look_again_lets_go_of_is_in_the_audit_trail(db: Database) -> None:
    """The look again lets go of a hold "launch-week" no longer gives (its deletion did not live to): the
    trail says so, by rackflow, naming the task and its rack, with the hold it had; a hold it keeps (a
    freeze still holds the task so long) writes nothing."""
    services = Services.build(db, CLOCK)
    window = await services.windows.get(await freeze(services, hours=1))
    assert isinstance(window.when, OneOff)
    outlasting, to_its_end = [await submit(services, await rack_named(services, n)) for n in "ab"]
    until = CLOCK.now() + timedelta(hours=5)
    await hold_as_a_stale_claim(db, outlasting, until)
    await hold_as_a_stale_claim(db, to_its_end, window.when.end)
    now = CLOCK.now()

    assert await FreezeGate(db).look_again(now) == 1

    [event], _ = await services.audit.list_events(EventFilter(target=outlasting.id))
    assert (event.principal, event.method, event.outcome, event.at) == (
        SYSTEM_PRINCIPAL,
        RELEASE_FREEZE_HOLD,
        OK,
        now,
    )
    assert event.target_ids == (str(outlasting.id), str(outlasting.rack_id))
    reason = f"waits for freeze 'launch-week' to end at {format_rfc3339(until)}"
    assert event.changes == [
        {"freeze_hold": "released", "task_id": str(outlasting.id), "rack_id": str(outlasting.rack_id),
         "held_reason": reason}
    ]  # fmt: skip
    assert event.request == {"task_id": str(outlasting.id), "decided_by": "look_again"}
    assert (await services.audit.list_events(EventFilter(target=to_its_end.id)))[0] == []
