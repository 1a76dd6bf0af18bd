"""Operation budgets on both databases: the gate at the claim admits up to the cap and hands the rest
back with a message naming the budget, lets them start when a task ends or the budget is raised or
deleted, caps per domain, and counts manual tasks, schedules' tasks and a rollout's alike. Claims are made
by hand on a FakeClock (the executor's own claim is in `test_the_executor_holds_and_then_runs…`); the
multi-instance guarantee runs with real processes in tests/e2e/test_budgets.py."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest

from rackflow.budgets.gate import BudgetGate
from rackflow.budgets.service import BudgetInput
from rackflow.clock import SystemClock
from rackflow.domain.inventory import Rack, RackSelection
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.errors import AlreadyExists, InvalidArgument, NotFound
from rackflow.services import Services
from rackflow.store import instances, task_runs
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.tasks.gates import consult
from tests.store.schedules_support import POWER_OFF, Env, make_env
from tests.store.test_executor import eventually, executing, finished, get
from tests.store.test_rollouts import _racks, _schedule

pytestmark = pytest.mark.asyncio

POWER_ON = Operation(OperationKind.POWER_ON)
FLEET_CAP = "waits for budget 'power' ({} of {} running)"


async def _budget(
    env: Env,
    cap: int,
    per_domain: int | None = None,
    operations: tuple[OperationKind, ...] = (OperationKind.POWER_OFF,),
    name: str = "power",
) -> uuid.UUID:
    given = BudgetInput(name, operations, cap, per_domain)
    return (await env.services.budgets.create(given)).id


async def _submit(env: Env, racks: Sequence[Rack], operation: Operation = POWER_OFF) -> list[Task]:
    """A task per rack, a second apart (so the claim's oldest-first order is theirs)."""
    submitted = []
    for rack in racks:
        env.clock.advance(timedelta(seconds=1))
        submitted += await env.services.tasks.submit(
            operation, [RackSelection(rack.id)], description="by hand", queue=QueueOptions()
        )
    return submitted


class Claimer:
    """One executor's claims, made by hand: the claim, then the budget gate, in one transaction."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.owner = uuid.uuid4()
        self.running: set[uuid.UUID] = set()

    async def claim(self, limit: int = 50) -> list[uuid.UUID]:
        db, now = self.env.db, self.env.clock.now()
        async with db.transaction() as conn:
            claimed = await task_runs.claim(
                db,
                conn,
                owner_id=self.owner,
                lease_ttl=timedelta(seconds=15),
                running_here=self.running,
                now=now,
                limit=limit,
            )
            gated = await consult([BudgetGate(db)], conn, claimed, owner_id=self.owner, now=now)
        started = [task.id for task, _ in gated.claimed]
        self.running.update(started)
        return started


async def _end(env: Env, task_ids: Sequence[uuid.UUID]) -> None:
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, list(task_ids), TaskStatus.COMPLETED, now=env.clock.now())


async def _tasks(env: Env, ids: Sequence[uuid.UUID]) -> list[Task]:
    return await env.services.tasks.get_tasks(list(ids))


def _after_back_off(env: Env) -> None:
    env.clock.advance(timedelta(seconds=10))


async def test_the_gate_admits_up_to_the_cap_and_holds_the_rest_with_the_message(db: Database) -> None:
    env = make_env(db)
    await _budget(env, 2)
    tasks = await _submit(env, await _racks(env, 5))
    claimer = Claimer(env)
    started = await claimer.claim()
    assert started == [t.id for t in tasks[:2]]  # oldest first
    held = await _tasks(env, [t.id for t in tasks[2:]])
    for task in held:
        assert task.status is TaskStatus.PENDING
        assert task.message == FLEET_CAP.format(2, 2)
        assert task.started_at is None
        assert task.not_before is not None and task.not_before > env.clock.now()
    assert await claimer.claim() == []  # the back-off: not even claimed again yet
    _after_back_off(env)
    assert await claimer.claim() == []  # still full
    await _end(env, started[:1])
    _after_back_off(env)
    assert await claimer.claim() == [tasks[2].id]  # one ended: one more starts


async def test_other_operations_are_not_counted(db: Database) -> None:
    env = make_env(db)
    await _budget(env, 1)
    racks = await _racks(env, 3)
    await _submit(env, racks[:1])
    on = await _submit(env, racks[1:], POWER_ON)
    started = await Claimer(env).claim()
    assert set(started) >= {t.id for t in on}
    assert len(started) == 3


async def test_raising_or_deleting_the_budget_lets_held_tasks_start_at_the_next_claim(db: Database) -> None:
    env = make_env(db)
    budget_id = await _budget(env, 1)
    tasks = await _submit(env, await _racks(env, 4))
    claimer = Claimer(env)
    assert await claimer.claim() == [tasks[0].id]
    await env.services.budgets.update(budget_id, ["budget.max_running"], BudgetInput(max_running=2))
    assert await claimer.claim() == [tasks[1].id]  # no back-off to wait for
    assert (await _tasks(env, [tasks[2].id]))[0].message == FLEET_CAP.format(2, 2)
    await env.services.budgets.delete(budget_id)
    assert await claimer.claim() == [t.id for t in tasks[2:]]


async def test_the_per_domain_cap_counts_a_rack_without_a_domain_as_its_own(db: Database) -> None:
    env = make_env(db)
    a = await _racks(env, 3, "a")
    b = await _racks(env, 2, "b")
    loose = await _racks(env, 2, "z")
    await env.services.inventory.create_domain("dom-a", [r.id for r in a])
    await env.services.inventory.create_domain("dom-b", [r.id for r in b])
    await _budget(env, 10, per_domain=1)
    tasks = await _submit(env, [*a, *b, *loose])
    by_rack = {t.rack_id: t for t in tasks}
    started = await Claimer(env).claim()
    assert sorted(started) == sorted(by_rack[r.id].id for r in (a[0], b[0], *loose))
    (held,) = await _tasks(env, [by_rack[a[1].id].id])
    assert held.message == "waits for budget 'power' (1 of 1 running in its NVLink domain)"


async def test_the_fleet_cap_holds_when_domains_have_room(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 4)
    await _budget(env, 3, per_domain=2)
    await _submit(env, racks)
    assert len(await Claimer(env).claim()) == 3


async def test_a_task_counts_for_every_budget_of_its_operation(db: Database) -> None:
    env = make_env(db)
    await _budget(env, 3, name="power")
    await _budget(env, 1, operations=(OperationKind.POWER_OFF, OperationKind.POWER_ON), name="any-power")
    racks = await _racks(env, 3)
    await _submit(env, racks[:1], POWER_ON)
    off = await _submit(env, racks[1:])
    claimer = Claimer(env)
    assert len(await claimer.claim()) == 1
    messages = {t.message for t in await _tasks(env, [t.id for t in off])}
    assert messages == {"waits for budget 'any-power' (1 of 1 running)"}


async def test_a_takeover_is_not_gated_and_still_counts(db: Database) -> None:
    """A later attempt was RUNNING, and counted, all along: it starts again whatever the budget says."""
    env = make_env(db)
    await _budget(env, 1)
    tasks = await _submit(env, await _racks(env, 2))
    first, second = Claimer(env), Claimer(env)
    assert await first.claim() == [tasks[0].id]
    _after_back_off(env)
    # The first claimer is no live instance: the second takes its task over (attempt 2), budget full or not.
    assert await second.claim(limit=1) == [tasks[0].id]
    assert await second.claim() == []
    (held,) = await _tasks(env, [tasks[1].id])
    assert held.message == FLEET_CAP.format(1, 1)


async def test_manual_tasks_and_two_schedules_share_one_budget(db: Database) -> None:
    env = make_env(db)
    racks = await _racks(env, 9)
    await _budget(env, 4)
    nightly = await env.schedule("nightly", racks=racks[:3])
    weekly = await env.schedule("weekly", racks=racks[3:6])
    manual = await _submit(env, racks[6:])
    scheduled: list[uuid.UUID] = []
    for schedule in (nightly, weekly):
        env.clock.advance(timedelta(seconds=1))
        scheduled += await env.services.schedules.trigger(schedule.id)
    claimer = Claimer(env)
    started = await claimer.claim()
    assert started[:3] == [t.id for t in manual]  # oldest first, whoever submitted it
    assert len(started) == 4
    everyone = [t.id for t in manual] + scheduled
    done: set[uuid.UUID] = set()
    while len(done) < len(everyone):
        running = [t for t in await _tasks(env, everyone) if t.status is TaskStatus.RUNNING]
        assert len(running) <= 4
        held = [t for t in await _tasks(env, everyone) if t.status is TaskStatus.PENDING]
        assert all(t.message == FLEET_CAP.format(4, 4) for t in held)
        await _end(env, [running[0].id])
        done.add(running[0].id)
        _after_back_off(env)
        await claimer.claim()


async def test_a_rollout_and_a_budget_compose(db: Database) -> None:
    """The rollout submits up to its cap (5); the budget lets 2 of them run; the rollout submits no more
    until its own tasks end, whatever the budget holds."""
    env = make_env(db)
    racks = await _racks(env, 8)
    await _budget(env, 2)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=5))
    submitted = await env.services.schedules.trigger(schedule.id)
    assert len(submitted) == 5
    claimer = Claimer(env)
    assert len(await claimer.claim()) == 2
    while True:
        found, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
        active = [t for t in found if t.status.is_active]
        running = [t for t in active if t.status is TaskStatus.RUNNING]
        assert len(active) <= 5 and len(running) <= 2
        if not active:
            break
        if running:
            await _end(env, [running[0].id])
        await env.services.rollouts.advance()
        _after_back_off(env)
        await claimer.claim()
    assert len(found) == 8 and all(t.status is TaskStatus.COMPLETED for t in found)


async def test_the_executor_holds_and_then_runs_a_manual_task(db: Database) -> None:
    services = Services.build(db, SystemClock())
    env = Env(db, make_env(db).clock, services)
    busy, rack = await _racks(env, 2)
    budget = await services.budgets.create(BudgetInput("power", (OperationKind.POWER_OFF,), 1))
    # A task of the budget's operation that another live instance runs, and keeps running.
    (other,) = await _submit(env, [busy])
    other_instance = uuid.uuid4()
    await instances.register(db, other_instance, host="elsewhere", pid=1)
    async with db.transaction() as conn:
        await task_runs.mark_running(conn, other.id, owner_id=other_instance, now=await db.now(conn))
    (task,) = await _submit(env, [rack])
    async with executing(db, lease_ttl=3600.0):

        async def held() -> bool:
            return (await get(db, task)).message == FLEET_CAP.format(1, 1)

        await eventually(held)
        assert (await get(db, task)).status is TaskStatus.PENDING  # the other task never ends
        await services.budgets.delete(budget.id)
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


async def test_budget_names_are_unique_and_inputs_are_checked(db: Database) -> None:
    env = make_env(db)
    await _budget(env, 2)
    with pytest.raises(AlreadyExists, match=r"budget\.name"):
        await _budget(env, 3)
    for given, field in (
        (BudgetInput("x", (), 1), "budget.operations"),
        (BudgetInput("x", (OperationKind.POWER_ON, OperationKind.POWER_ON), 1), r"budget.operations\[1\]"),
        (BudgetInput("x", (OperationKind.POWER_ON,), 0), "budget.max_running"),
        (BudgetInput("x", (OperationKind.POWER_ON,), 1, 0), "budget.max_running_per_domain"),
        (BudgetInput(" fw", (OperationKind.POWER_ON,), 1), "budget.name"),
    ):
        with pytest.raises(InvalidArgument, match=field):
            await env.services.budgets.create(given)
    assert [b.name for b in await env.services.budgets.list_budgets()] == ["power"]
    with pytest.raises(NotFound, match="id"):
        await env.services.budgets.delete(uuid.uuid4())


async def test_a_queue_behind_a_full_budget_does_not_crowd_other_tasks_out_of_the_claims(
    db: Database,
) -> None:
    """The tasks behind a full cap wait out the back-off with the held ones, so the next claim reaches the
    task no budget holds instead of taking (and handing back) more of the queue."""
    env = make_env(db)
    await _budget(env, 1)
    racks = await _racks(env, 12)
    queued = await _submit(env, racks[:11])
    claimer = Claimer(env)
    assert await claimer.claim(limit=3) == [queued[0].id]  # 2 claimed and held, 8 never claimed
    for task in await _tasks(env, [t.id for t in queued[1:]]):
        assert task.status is TaskStatus.PENDING and task.message == FLEET_CAP.format(1, 1)
        assert task.not_before is not None and task.not_before > env.clock.now()
    (power_on,) = await _submit(env, racks[11:], POWER_ON)
    assert await claimer.claim(limit=3) == [power_on.id]


async def test_a_full_domain_pushes_back_only_its_own_queue(db: Database) -> None:
    env = make_env(db)
    a = await _racks(env, 3, "a")
    (b,) = await _racks(env, 1, "b")
    await env.services.inventory.create_domain("dom-a", [r.id for r in a])
    await _budget(env, 10, per_domain=1)
    in_a = await _submit(env, a)
    (in_b,) = await _submit(env, [b])
    claimer = Claimer(env)
    assert await claimer.claim(limit=2) == [in_a[0].id]
    (pushed,) = await _tasks(env, [in_a[2].id])
    assert pushed.message == "waits for budget 'power' (1 of 1 running in its NVLink domain)"
    assert await claimer.claim(limit=2) == [in_b.id]
